"""`rlfleet catalog`, `costs` and `validate`: machine-readable output and one-line errors."""

from __future__ import annotations

import pytest


def test_catalog_lists_gpus_and_models(cli) -> None:  # type: ignore[no-untyped-def]
    res = cli("catalog", "--json")
    assert res.code == 0
    obj = res.json()
    assert {"H100", "H20", "L40S", "B200"} <= {g["name"] for g in obj["gpus"]}
    assert "qwen2.5-7b" in {m["name"] for m in obj["models"]}
    assert "mixed-h800-h20-l40s" in obj["example_clusters"]
    human = cli("catalog")
    assert "H20" in human.out and "editable defaults" in human.out


def test_costs_decode_json(cli) -> None:  # type: ignore[no-untyped-def]
    res = cli("costs", "decode", "--gpu", "h100", "--model", "llama-3.1-8b", "--tp", "1", "--batch", "64",
              "--context", "1024", "--json")
    assert res.code == 0, res.err
    obj = res.json()
    assert obj["seconds"] > 0 and obj["source"] == "roofline" and obj["fits"] is True
    assert obj["max_batch"] == 256


def test_costs_decode_reports_kv_overflow(cli) -> None:  # type: ignore[no-untyped-def]
    obj = cli("costs", "decode", "--gpu", "L4", "--model", "qwen2.5-7b", "--batch", "256", "--context", "8192",
              "--json").json()
    assert obj["fits"] is False and obj["max_batch"] < 256


def test_costs_prefill_train_sync_json(cli) -> None:  # type: ignore[no-untyped-def]
    pre = cli("costs", "prefill", "--gpu", "H20", "--model", "qwen2.5-7b", "--tp", "2", "--tokens", "4096", "--json")
    assert pre.code == 0 and pre.json()["seconds"] > 0
    train = cli("costs", "train", "--gpu", "H800", "--model", "qwen2.5-7b", "--dp", "8", "--tp", "1", "--pp", "1",
                "--tokens", "1000000", "--json").json()
    assert train["fits"] is True and 0.2 < train["mfu"] < 0.8 and train["max_batch"] >= 1
    single = cli("costs", "train", "--gpu", "L4", "--model", "qwen2.5-7b", "--dp", "1", "--tokens", "4096",
                 "--zero-stage", "0", "--json").json()
    assert single["fits"] is False and single["max_batch"] == 0
    sync = cli("costs", "sync", "--from", "H800", "--to", "H20", "--model", "qwen2.5-7b", "--engines", "16",
               "--json").json()
    assert sync["seconds"] > 0 and sync["source"] == "roofline" and sync["path_bytes_per_s"] == 50e9


def test_costs_prefill_prices_a_batch_of_prompts_each_attending_to_itself(cli) -> None:  # type: ignore[no-untyped-def]
    base = ["costs", "prefill", "--gpu", "H100", "--model", "llama-3.1-8b", "--json"]
    batch = cli(*base, "--prompts", "16", "--prompt-len", "2048").json()
    assert (batch["prompts"], batch["prompt_len"], batch["tokens"], batch["fits"]) == (16, 2048, 32768, True)
    one_long = cli(*base, "--tokens", "32768").json()
    assert batch["seconds"] < one_long["seconds"]  # 16 short causal attentions cost less than one long one
    assert cli(*base, "--prompts", "1", "--prompt-len", "32768").json()["seconds"] == one_long["seconds"]
    assert cli(*base, "--prompt-len", "2048").json()["seconds"] < batch["seconds"]
    l4 = cli("costs", "prefill", "--gpu", "L4", "--model", "qwen2.5-7b", "--prompts", "256", "--prompt-len", "4096")
    assert l4.code == 0 and "does NOT fit: the KV cache holds" in l4.out


@pytest.mark.parametrize(("flags", "needle"), [
    (["--tokens", "8", "--prompts", "2"], "not both"), (["--tokens", "8", "--prompt-len", "2"], "not both"),
    (["--prompts", "4"], "--prompt-len L"), ([], "--tokens N"), (["--prompts", "0", "--prompt-len", "8"], "--prompts"),
    (["--prompts", "4", "--prompt-len", "x"], "--prompt-len"), (["--prompt-len", "-3"], "--prompt-len"),
])
def test_costs_prefill_bad_batch_flags(cli, flags: list[str], needle: str) -> None:  # type: ignore[no-untyped-def]
    _one_line_error(cli("costs", "prefill", "--gpu", "H100", "--model", "llama-3.1-8b", *flags), needle)


def _one_line_error(res, *needles: str) -> None:  # type: ignore[no-untyped-def]
    assert res.code == 2
    assert res.out == ""
    lines = res.err.strip().splitlines()
    assert len(lines) == 1, res.err
    assert "Traceback" not in res.err
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_unknown_gpu_lists_known(cli) -> None:  # type: ignore[no-untyped-def]
    res = cli("costs", "decode", "--gpu", "H1000", "--model", "llama-3.1-8b", "--batch", "1", "--context", "1")
    _one_line_error(res, "unknown GPU type 'H1000'", "H100", "L40S")


def test_unknown_model_lists_known(cli) -> None:  # type: ignore[no-untyped-def]
    res = cli("costs", "prefill", "--gpu", "H100", "--model", "gpt-5", "--tokens", "10")
    _one_line_error(res, "unknown model 'gpt-5'", "qwen2.5-7b")


@pytest.mark.parametrize("value", ["0", "-4", "two"])
def test_bad_counts(cli, value: str) -> None:  # type: ignore[no-untyped-def]
    res = cli("costs", "decode", "--gpu", "H100", "--model", "llama-3.1-8b", "--batch", value, "--context", "8")
    _one_line_error(res, "--batch")


def test_model_that_fits_no_configuration(cli) -> None:  # type: ignore[no-untyped-def]
    res = cli("costs", "decode", "--gpu", "L4", "--model", "gpt3-175b", "--batch", "1", "--context", "128")
    _one_line_error(res, "gpt3-175b", "fits no engine on L4", "more memory")


def test_yaml_syntax_error_names_file_and_line(cli, write) -> None:  # type: ignore[no-untyped-def]
    path = write("c.yaml", "name: x\nnode_groups:\n  - {gpu_type: H100, nodes: [1\n")
    _one_line_error(cli("validate", "--cluster", str(path)), f"{path}:4", "YAML syntax error")


def test_missing_field_is_named(cli, write) -> None:  # type: ignore[no-untyped-def]
    path = write("w.yaml", "model: qwen2.5-1.5b\nprompts_per_step: 4\nprompt_len: {kind: fixed, value: 8}\n")
    _one_line_error(cli("validate", "--workload", str(path)), "missing field 'response_len'")


def test_negative_count_in_file(cli, write) -> None:  # type: ignore[no-untyped-def]
    path = write("c.yaml", "node_groups:\n  - {gpu_type: H100, nodes: -2}\n")
    _one_line_error(cli("validate", "--cluster", str(path)), "node_groups.0.nodes", "greater than or equal to 1")


def test_unknown_gpu_in_file(cli, write) -> None:  # type: ignore[no-untyped-def]
    path = write("c.yaml", "node_groups:\n  - {gpu_type: V100, nodes: 2}\n")
    _one_line_error(cli("validate", "--cluster", str(path)), "unknown GPU type 'V100'")


def test_empty_file(cli, write) -> None:  # type: ignore[no-untyped-def]
    path = write("c.yaml", "")
    _one_line_error(cli("validate", "--cluster", str(path)), "empty")


def test_yaml_alias_bomb_refused(cli, write) -> None:  # type: ignore[no-untyped-def]
    lines = ["a: &a [x, x, x, x, x, x, x, x, x]"]
    lines += [f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]" for i in range(12)]
    path = write("bomb.yaml", "\n".join(lines) + "\n")
    _one_line_error(cli("validate", "--cluster", str(path)), "aliases")


def test_validate_examples(cli) -> None:  # type: ignore[no-untyped-def]
    from importlib import resources

    root = resources.files("traces").joinpath("data")
    res = cli("validate", "--cluster", str(root / "clusters" / "a100-l4.yaml"),
              "--workload", str(root / "workloads" / "qwen2.5-7b-grpo-longtail.yaml"), "--json")
    assert res.code == 0 and res.json()["ok"] is True


def test_simulate_cli_writes_timeline_and_gantt(cli, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from importlib import resources

    root = resources.files("traces").joinpath("data")
    csv, png = tmp_path / "t.csv", tmp_path / "g.png"
    res = cli("simulate", "--cluster", str(root / "clusters" / "mixed-h800-h20-l40s.yaml"),
              "--workload", str(root / "workloads" / "qwen2.5-1.5b-math-short.yaml"),
              "--plan", str(root / "plans" / "mixed-math-short.json"), "--steps", "3", "--json",
              "--timeline", str(csv), "--gantt", str(png))
    assert res.code == 0, res.err
    obj = res.json()
    for key in ("samples_per_s", "tokens_per_s", "mean_step_s", "max_staleness", "utilization", "cost_per_1k_samples"):
        assert key in obj
    assert obj["max_staleness"] <= 4
    assert csv.read_text().startswith("resource,group,activity,start,end,version,samples")
    assert png.read_bytes()[:4] == b"\x89PNG"


def _stderr_on_a_terminal(*argv: str) -> str:
    """Run the CLI with stderr on a pseudo-terminal (100 columns) and return what it drew there."""
    import fcntl
    import os
    import pty
    import struct
    import subprocess
    import sys
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 100, 0, 0))
    subprocess.run([sys.executable, "-m", "planner.cli", *argv], stderr=slave, stdout=subprocess.DEVNULL,
                   timeout=300, check=True)
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    return b"".join(chunks).decode("utf-8", "replace")


def test_progress_bars_show_on_a_terminal_and_not_when_quiet_or_piped() -> None:
    import subprocess
    import sys

    sim = ["simulate", "--cluster", "traces/data/clusters/mixed-h800-h20-l40s.yaml",
           "--workload", "traces/data/workloads/qwen2.5-1.5b-math-short.yaml",
           "--plan", "traces/data/plans/mixed-math-short.json", "--steps", "3"]
    assert "simulating" in _stderr_on_a_terminal(*sim)
    assert "simulating" not in _stderr_on_a_terminal(*sim, "--quiet")
    piped = subprocess.run([sys.executable, "-m", "planner.cli", *sim], capture_output=True, text=True, check=True)
    assert piped.stderr == ""


def test_plan_no_marginal_skips_the_marginal_values(cli) -> None:  # type: ignore[no-untyped-def]
    base = ["plan", "--cluster", "traces/data/clusters/h800-h20-l40s-4node.yaml", "--workload",
            "traces/data/workloads/qwen2.5-1.5b-math-short.yaml", "--no-baselines", "--no-settle", "--sim-steps", "4"]
    full, bare = cli(*base, "--json"), cli(*base, "--json", "--no-marginal")
    assert full.code == bare.code == 0
    assert full.json()["marginal_samples_per_s_per_gpu"] and bare.json()["marginal_samples_per_s_per_gpu"] == {}
    assert full.json()["plan"] == bare.json()["plan"]  # the values are beside the plan, not part of it
    assert "one more GPU adds" not in cli(*base, "--no-marginal").out
