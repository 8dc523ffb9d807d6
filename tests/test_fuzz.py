"""Fuzzed input files through every CLI entry point: a result or one clear line with exit 2.

Hypothesis builds cluster, workload and plan files, valid and broken (wrong types, missing fields,
negative or huge numbers, unknown names, unicode, empty files, YAML anchors and bombs, very long
lists, junk), and feeds them to `validate`, `simulate`, `plan` and `costs`. Every call must either
succeed with sane output or print exactly one line to stderr and exit 2: never a traceback, never a
hang (each call has a wall-clock alarm) and never a nonsense figure.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from fuzz_cli import SECONDS_PER_CALL, SUCCEEDED, TRIED, check, finite, run
from fuzz_edges import (
    BASE_CLUSTER,
    BASE_PLAN,
    BASE_WORKLOADS,
    EDGE_VALUES,
    HISTOGRAM,
    PROFILE,
    csv_edges,
    duplicate_keys,
    float_edges,
    path_mistakes,
    to_text,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

CHECKED: Counter[str] = Counter()  # `costs` answers whose JSON was checked, by stage
BAD_VALUES = [0, -1, -(10**9), 10**12, 10**30, 1.5, float("nan"), "eight", None, [], {"a": 1}, True, "ü" * 300]
GPUS = ["H100", "H800", "H20", "L40S", "A100-80G", "L4", "h100", "H1000", "", "Ｈ１００", "A100\x00"]
MODELS = ["qwen2.5-1.5b", "qwen2.5-0.5b", "llama-3.1-8b", "qwen2.5-7b", "gpt-5", "", "ｑwen"]


# ---- values that are sometimes wrong ------------------------------------------------------------
def _number(lo: int, hi: int) -> st.SearchStrategy[Any]:
    """Mostly in range; sometimes zero, negative, huge, fractional, a string, null or a list."""
    return st.one_of(st.integers(lo, hi), st.integers(lo, hi), st.integers(lo, hi), st.sampled_from(BAD_VALUES))


def _length_dist(cap: int) -> st.SearchStrategy[Any]:
    good = st.one_of(
        st.builds(lambda v: {"kind": "fixed", "value": v}, _number(1, cap)),
        st.builds(lambda lo, d: {"kind": "uniform", "low": lo, "high": lo + d}, st.integers(1, cap // 2),
                  st.integers(0, cap // 2)),
        st.builds(lambda m, s, c: {"kind": "lognormal", "mean": m, "sigma": s, "cap": c}, st.integers(8, cap // 2),
                  st.floats(0.05, 2.0), st.integers(cap // 2, cap)),
        st.builds(lambda n: {"kind": "empirical", "lengths": list(range(1, n + 1)), "counts": [1] * n},
                  st.integers(1, 40)),
    )
    bad = st.sampled_from([
        {"kind": "poisson", "mean": 3}, {"kind": "fixed"}, {"kind": "uniform", "low": 10, "high": 5},
        {"kind": "lognormal", "mean": -3, "sigma": 1, "cap": 10}, {"kind": "empirical", "lengths": [1, 2]},
        {"kind": "empirical", "file": "missing.csv"}, 7, "long", None, [],
    ])
    return st.one_of(good, good, good, bad)


def _junk() -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from([
            "", "\n", "null", "[]", "42", "- a\n- b", "{", "a: [1, 2", "\t- x", "\x00\x01", "é: ü",
            "a: &a [1]\nb: *a\n" * 3,
            "a: &a [x, x, x, x, x, x, x, x]\n" + "".join(f"b{i}: &b{i} [*{'a' if i == 0 else f'b{i - 1}'}]*8\n"
                                                          for i in range(3)),
            "a: &a ['lol','lol','lol','lol','lol','lol','lol','lol','lol']\n"
            + "".join(f"{c}: &{c} [" + ",".join([f"*{p}"] * 9) + "]\n"
                      for p, c in zip("abcdefgh", "bcdefghi", strict=True)),
            "!!python/object/apply:os.system ['echo hacked']",
        ]),
        st.text(max_size=200),
    )


@st.composite
def scenario(draw: st.DrawFn) -> tuple[str, str, str]:
    """A coherent (cluster, workload, plan) triple, then each file broken with some probability."""
    types = draw(st.lists(st.sampled_from(["H100", "H800", "H20", "L40S", "A100-80G"]), min_size=1, max_size=3,
                          unique=True))
    per_node = draw(st.sampled_from([4, 8]))
    groups = [{"gpu_type": t, "nodes": draw(st.integers(1, 2)), "gpus_per_node": per_node} for t in types]
    cluster: dict[str, Any] = {"name": "fleet", "node_groups": groups}
    mode = draw(st.sampled_from(["async", "async", "sync", "colocated"]))
    eta = draw(st.integers(0, 3)) if mode == "async" else 0
    workload: dict[str, Any] = {
        "name": "w", "model": draw(st.sampled_from(["qwen2.5-0.5b", "qwen2.5-1.5b"])),
        "prompts_per_step": draw(st.integers(1, 8)), "group_size": draw(st.integers(1, 4)),
        "prompt_len": draw(_length_dist(256).filter(lambda d: isinstance(d, dict) and "file" not in d)),
        "response_len": draw(st.sampled_from([{"kind": "fixed", "value": 64},
                                              {"kind": "lognormal", "mean": 200, "sigma": 0.8, "cap": 512},
                                              {"kind": "uniform", "low": 8, "high": 300}])),
        "mode": mode, "staleness": eta, "interruptible": draw(st.booleans()),
    }
    t_group = draw(st.sampled_from(groups))
    t_gpus = t_group["nodes"] * per_node
    dp = draw(st.sampled_from([d for d in (1, 2, 4, 8) if d <= t_gpus]))
    if mode == "colocated":
        rollout = [{"gpu_type": t_group["gpu_type"], "tp": 1, "instances": dp}]
    else:
        others = [g for g in groups if g is not t_group] or [t_group]
        r_group = draw(st.sampled_from(others))
        free = r_group["nodes"] * per_node - (dp if r_group is t_group else 0)
        rollout = [{"gpu_type": r_group["gpu_type"], "tp": 1, "instances": draw(st.integers(1, max(1, free)))}]
    plan: dict[str, Any] = {"schema_version": 1, "mode": mode, "staleness": eta, "rollout": rollout,
                            "trainer": {"gpu_type": t_group["gpu_type"], "dp": dp}}
    texts = []
    for data, dump in ((cluster, _yaml), (workload, _yaml), (plan, json.dumps)):
        texts.append(draw(_broken(data, dump)) if draw(st.integers(0, 2)) == 0 else dump(data))
    return texts[0], texts[1], texts[2]


def _yaml(data: Any) -> str:
    return yaml.safe_dump(data, allow_unicode=True)


@st.composite
def _broken(draw: st.DrawFn, data: dict[str, Any], dump: Any) -> str:
    """One way to break a file: junk text, a missing or unknown field, a bad value, a huge list."""
    how = draw(st.sampled_from(["junk", "drop", "bad", "bad", "unknown", "long", "deep"]))
    data = json.loads(json.dumps(data))
    if how == "junk":
        return draw(_junk())
    key = draw(st.sampled_from(sorted(data)))
    if how == "drop":
        data.pop(key)
    elif how == "bad":
        data[key] = draw(st.sampled_from(BAD_VALUES))
    elif how == "unknown":
        data[draw(st.sampled_from(["extra", "ｎａｍｅ", "x" * 1000]))] = 1
    elif how == "long":
        data[key] = [data[key]] * 1500 if not isinstance(data[key], list) else data[key] * 1500
    else:  # a bad value one level down
        inner = next((v for v in data.values() if isinstance(v, dict)),
                     next((v[0] for v in data.values() if isinstance(v, list) and v and isinstance(v[0], dict)),
                          None))
        if inner:
            inner[draw(st.sampled_from(sorted(inner)))] = draw(st.sampled_from(BAD_VALUES))
    try:
        return dump(data)
    except ValueError:  # nan in strict JSON
        return str(data)


@settings(max_examples=350, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                 HealthCheck.data_too_large, HealthCheck.large_base_example])
@given(files=scenario(), command=st.sampled_from(["validate", "validate", "simulate", "simulate", "plan"]))
def _fuzz_files(tmp_path: Path, capsys: pytest.CaptureFixture[str], files: tuple[str, str, str], command: str
                ) -> None:
    cluster, workload, plan = files
    c, w, p = tmp_path / "c.yaml", tmp_path / "w.yaml", tmp_path / "p.json"
    c.write_text(cluster, encoding="utf-8")
    w.write_text(workload, encoding="utf-8")
    p.write_text(plan, encoding="utf-8")
    if command == "validate":
        argv = ["validate", "--cluster", str(c), "--workload", str(w), "--plan", str(p), "--json"]
    elif command == "simulate":
        argv = ["simulate", "--cluster", str(c), "--workload", str(w), "--plan", str(p), "--steps", "2", "--json"]
    else:
        argv = ["plan", "--cluster", str(c), "--workload", str(w), "--top-k", "1", "--sim-steps", "2",
                "--no-baselines", "--json"]
    obj = check(*run(capsys, argv), argv)
    if obj is None:
        return
    assert finite(obj), obj
    if command == "simulate":
        assert obj["samples_per_s"] >= 0 and obj["max_staleness"] <= json.loads(plan).get("staleness", 0)
    if command == "plan":
        cluster_gpus = sum(g["nodes"] * g.get("gpus_per_node", 8) for g in yaml.safe_load(cluster)["node_groups"])
        shared = obj["mode"] == "colocated"  # the trainer's GPUs also generate
        used = sum(r["train"] + (0 if shared else r["rollout"]) for r in obj["gpus"].values())
        assert obj["samples_per_s"] > 0 and 0 < used <= cluster_gpus


@settings(max_examples=1300, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(stage=st.sampled_from(["decode", "prefill", "train", "sync"]), gpu=st.sampled_from(GPUS),
       model=st.sampled_from(MODELS), n=st.sampled_from(["1", "64", "0", "-5", "1e3", "x", "99999999999", "３"]),
       tp=st.sampled_from(["1", "2", "8", "0", "64", "-1"]))
def _fuzz_costs(capsys: pytest.CaptureFixture[str], stage: str, gpu: str, model: str, n: str, tp: str) -> None:
    if stage == "decode":
        argv = ["costs", "decode", "--gpu", gpu, "--model", model, "--tp", tp, "--batch", n, "--context", n]
    elif stage == "prefill":
        argv = ["costs", "prefill", "--gpu", gpu, "--model", model, "--tp", tp, "--tokens", n]
    elif stage == "train":
        argv = ["costs", "train", "--gpu", gpu, "--model", model, "--dp", n, "--tp", tp, "--tokens", n]
    else:
        argv = ["costs", "sync", "--from", gpu, "--to", "H20", "--model", model, "--engines", n]
    argv.append("--json")  # check() reads the JSON only when the argv it is given asks for it
    obj = check(*run(capsys, argv), argv)
    if obj is not None:
        CHECKED[stage] += 1
        assert obj["seconds"] >= 0 and finite(obj), obj


def _counted(fuzz: Any, commands: tuple[str, ...], *args: Any) -> tuple[int, Counter[str]]:
    """Run one fuzz function; how many inputs it tried, and what succeeded meanwhile."""
    tried, succeeded = sum(TRIED.values()), SUCCEEDED.copy()
    fuzz(*args)
    gained = SUCCEEDED - succeeded
    print(f"fuzzed {sum(TRIED.values()) - tried} inputs; succeeded: {dict(gained)}; every other one: one line, exit 2")
    return sum(TRIED.values()) - tried, Counter({c: gained[c] for c in commands})


def test_cli_never_crashes_on_fuzzed_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tried, succeeded = _counted(_fuzz_files, ("validate", "simulate", "plan"), tmp_path, capsys)
    assert tried >= 330 and min(succeeded.values()) >= 5, (tried, succeeded)  # valid inputs exercised too


def test_costs_never_crash_on_fuzzed_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    checked = CHECKED.copy()
    tried, succeeded = _counted(_fuzz_costs, ("costs",), capsys)
    assert tried >= 1200 and succeeded["costs"] >= 5, (tried, succeeded)
    checked = CHECKED - checked
    assert all(checked[stage] >= 5 for stage in ("decode", "prefill", "train", "sync")), checked


def test_huge_inputs_are_bounded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A 1.6M-GPU fleet plans in bounded time; a 4-billion-sample batch is refused up front."""
    import time

    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("node_groups:\n  - {gpu_type: H100, nodes: 100000}\n  - {gpu_type: H20, nodes: 100000}\n")
    job = tmp_path / "job.yaml"
    job.write_text("model: qwen2.5-1.5b\nprompts_per_step: 1000000\ngroup_size: 4096\n"
                   "prompt_len: {kind: fixed, value: 10}\nresponse_len: {kind: fixed, value: 10}\nstaleness: 1\n")
    t0 = time.monotonic()
    argv = ["plan", "--cluster", str(fleet), "--workload", "traces/data/workloads/qwen2.5-1.5b-math-short.yaml",
            "--no-baselines", "--sim-steps", "1", "--top-k", "1", "--json"]
    obj = check(*run(capsys, argv), argv)
    assert obj is not None and obj["samples_per_s"] > 0
    assert time.monotonic() - t0 < SECONDS_PER_CALL
    argv = ["simulate", "--cluster", "traces/data/clusters/mixed-h800-h20-l40s.yaml", "--workload", str(job),
            "--plan", "traces/data/plans/mixed-math-short.json"]
    code, _, err = run(capsys, argv)
    assert code == 2 and "at most 20,000,000" in err


# ---- edges: float values, duplicate keys, path mistakes (generated in tests/fuzz_edges.py) ----------
# numbers as people (and int()/float()) may spell them: some parse, some must be refused
ODD_NUMBERS = ("", " 7", "7 ", "1_000", "0x10", "1e3", "-0", "+3", "NaN", "Infinity", "٣", "1,000", "0.0", "1e-5",
               "9" * 30, "7\x00", "--", "-", "1/2", "½")
EDGE_SECONDS = 20  # a small job: an input that keeps the simulator busy longer than this is a hang
FILE_NAMES = {"cluster": "c.yaml", "workload": "w.yaml", "plan": "p.json"}


def _files(folder: Path, texts: dict[str, str]) -> list[str]:
    """The three files written from their texts: the --cluster/--workload/--plan arguments."""
    args = []
    for which, name in FILE_NAMES.items():
        (folder / name).write_text(texts[which], encoding="utf-8")
        args += [f"--{which}", str(folder / name)]
    return args


def _bases(as_json: bool = False) -> dict[str, str]:
    return {"cluster": to_text(BASE_CLUSTER, as_json), "workload": to_text(BASE_WORKLOADS[0], as_json),
            "plan": to_text(BASE_PLAN, as_json)}


def test_float_edges_in_every_numeric_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """1e-300, 1e308, nan, inf, -0.0 and more in each number of each file: refused in one line naming
    the field, or validated and then simulated in bounded time with finite figures."""
    refused = 0
    for n, (which, doc, label) in enumerate(float_edges()):
        files = _files(tmp_path, {**_bases(), which: to_text(doc, as_json=n % 2 == 1)})
        argv = ["validate", f"--{which}", files[files.index(f"--{which}") + 1], "--json"]
        code, out, err = run(capsys, argv, EDGE_SECONDS)
        if check(code, out, err, [*argv, label]) is None:
            field = label.split(" = ")[0].split(": ")[1].split(".")
            assert any(part in err for part in field if not part.isdigit()), (label, err)
            refused += 1
            continue
        _simulates(capsys, [*files, "--steps", "2"], label)
    assert refused >= 100  # most edge values are absurd for most fields


def _simulates(capsys: pytest.CaptureFixture[str], args: list[str], label: str) -> None:
    """`simulate` gives finite figures in bounded time, or one line and exit 2."""
    argv = ["simulate", *args, "--json"]
    obj = check(*run(capsys, argv, EDGE_SECONDS), [*argv, label])
    assert obj is None or (finite(obj) and obj["samples_per_s"] >= 0), (label, obj)


def test_float_edges_in_csv_inputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The same edge values in a length histogram's cells and in a cost table's numbers."""
    histogram, workload = tmp_path / "h.csv", tmp_path / "hist-w.yaml"
    workload.write_text(to_text({**BASE_WORKLOADS[0], "response_len": {"kind": "empirical", "file": "h.csv"}}, False))
    for text, label in csv_edges(HISTOGRAM):
        histogram.write_text(text)
        argv = ["validate", "--workload", str(workload), "--json"]
        obj = check(*run(capsys, argv, EDGE_SECONDS), [*argv, label])
        assert obj is None or 1 <= obj["workload"]["mean_response"] <= 64, (label, obj)
    files, table = _files(tmp_path, _bases()), tmp_path / "profile.csv"
    for text, label in csv_edges(PROFILE):
        table.write_text(text)
        _simulates(capsys, [*files, "--steps", "2", "--profile", str(table)], label)


def _flag_argvs(files: list[str]) -> dict[str, list[str]]:
    """Each command's argv with one numeric flag to fill (its value goes last)."""
    c, w, p = files[1], files[3], files[5]
    sync = ["costs", "sync", "--from", "H100", "--to", "H20", "--model", "qwen2.5-1.5b"]
    decode = ["costs", "decode", "--gpu", "H20", "--model", "qwen2.5-1.5b", "--batch", "8", "--context", "512"]
    train = ["costs", "train", "--gpu", "H100", "--model", "qwen2.5-1.5b", "--tokens", "4096"]
    plan = ["plan", "--cluster", c, "--workload", w, "--top-k", "1", "--sim-steps", "1", "--no-baselines"]
    argvs = {f"sync {f}": [*sync, f] for f in ("--engines", "--link-gb-per-s")}
    argvs |= {f"decode {f}": [*decode, f] for f in ("--tp", "--batch", "--context")}
    argvs |= {f"train {f}": [*train, f] for f in ("--dp", "--tp", "--pp", "--tokens", "--seq-len", "--gpus-per-node",
                                                 "--inter-node-gb-per-s")}
    argvs |= {f"simulate {f}": ["simulate", *files, f] for f in ("--steps", "--seed")}
    argvs |= {f"plan {f}": [*plan, f] for f in ("--budget", "--target", "--top-k", "--sim-steps", "--seed")}
    argvs |= {f"report {f}": ["report", p, "--cluster", c, "--workload", w, "--out", "REPORT", f]
              for f in ("--steps", "--seed")}
    return argvs


def test_float_edges_in_numeric_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every numeric flag given each edge value, and the quick ones odd spellings of numbers too:
    argparse's one line (exit 2), or a finite answer."""
    files = _files(tmp_path, _bases())
    for name, argv in _flag_argvs(files).items():
        spellings = [repr(v) for v in EDGE_VALUES] + (list(ODD_NUMBERS) if name.startswith(("decode", "sync")) else [])
        for value in spellings:
            full = [str(tmp_path / a) if a == "REPORT" else a for a in argv] + [value, "--json"]
            obj = check(*run(capsys, full, EDGE_SECONDS), [*full, name])
            assert obj is None or finite(obj), (name, value, obj)


def test_a_key_given_twice_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every key of every mapping, given twice: one line naming the key and the file, never the last value kept."""
    for which, text, key in duplicate_keys():
        files = _files(tmp_path, {**_bases(), which: text})
        argv = ["validate", *files]
        code, out, err = run(capsys, argv)
        check(code, out, err, argv)
        assert code == 2 and f"duplicate key '{key}'" in err and FILE_NAMES[which] in err, (which, key, err)


def _path_argvs(base: list[str], folder: Path, path: Path) -> dict[str, list[str]]:
    """Every file argument of the CLI given `path` (the others valid)."""
    workload = folder / "hist-w.yaml"
    workload.write_text(to_text({**BASE_WORKLOADS[0], "response_len": {"kind": "empirical", "file": str(path)}}, False))
    c, w, p = base[1], base[3], base[5]
    return {
        "validate --cluster": ["validate", "--cluster", str(path)],
        "validate --workload": ["validate", "--workload", str(path)],
        "validate --plan": ["validate", "--plan", str(path)],
        "histogram file:": ["validate", "--workload", str(workload)],
        "simulate --profile": ["simulate", *base, "--steps", "1", "--profile", str(path)],
        "fidelity RUN_DIR": ["fidelity", str(path)],
        "simulate --timeline": ["simulate", *base, "--steps", "1", "--timeline", str(path)],
        "plan --out": ["plan", "--cluster", c, "--workload", w, "--top-k", "1", "--sim-steps", "1",
                       "--no-baselines", "--out", str(path)],
        "report --out": ["report", p, "--cluster", c, "--workload", w, "--steps", "1", "--out", str(path)],
    }


def test_path_mistakes_in_every_file_argument(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A folder, a path under a file, a link loop, a FIFO, a link to /dev/null, ... for every file
    argument: one line, exit 2; nothing is replaced and no temp file is left."""
    base = _files(tmp_path, _bases())
    mistakes = path_mistakes(tmp_path / "paths")
    for kind, path in mistakes.items():
        for name, argv in _path_argvs(base, tmp_path, path).items():
            code, out, err = run(capsys, argv)
            check(code, out, err, [*argv, kind])
            writes = name.endswith(("--timeline", "--out"))
            if (writes and kind == "missing") or (name, kind) == ("report --out", "folder"):
                assert code == 0, (kind, name, err)  # a new file, or the folder report --out wants
                if kind == "missing":  # the next command must find it missing too
                    shutil.rmtree(path) if path.is_dir() else path.unlink()
            else:
                assert code == 2, (kind, name, out)
    assert stat.S_ISFIFO(os.stat(mistakes["fifo"]).st_mode) and stat.S_ISCHR(os.stat("/dev/null").st_mode)
    assert not list(tmp_path.rglob("*.tmp"))



def test_fuzz_count_report() -> None:
    """Runs after the fuzz tests above (file order): print how many inputs they tried in all. Each
    test checks its own count (a test run alone is checked too); this one sums them for the README."""
    total = sum(TRIED.values())
    print(f"fuzzed CLI inputs tried: {total} ({dict(TRIED)}); succeeded: {dict(SUCCEEDED)}; "
          "every other one: one line, exit 2")
