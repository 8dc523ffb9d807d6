"""Fuzzed input files through every CLI entry point: a result or one clear line with exit 2.

Hypothesis builds cluster, workload and plan files, valid and broken (wrong types, missing fields,
negative or huge numbers, unknown names, unicode, empty files, YAML anchors and bombs, very long
lists, junk), and feeds them to `validate`, `simulate`, `plan` and `costs`. Every call must either
succeed with sane output or print exactly one line to stderr and exit 2: never a traceback, never a
hang (each call has a wall-clock alarm) and never a nonsense figure.
"""

from __future__ import annotations

import json
import math
import signal
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.cli import main

SECONDS_PER_CALL = 60
BAD_VALUES = [0, -1, -(10**9), 10**12, 10**30, 1.5, float("nan"), "eight", None, [], {"a": 1}, True, "ü" * 300]
TRIED: Counter[str] = Counter()
SUCCEEDED: Counter[str] = Counter()  # exit 0 with sane output: valid inputs were exercised too
CHECKED: Counter[str] = Counter()  # `costs` answers whose JSON was checked, by stage
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


# ---- running the CLI --------------------------------------------------------------------------
class Hang(Exception):
    pass


@contextmanager
def _alarm(seconds: int) -> Iterator[None]:
    def ring(_signum: int, _frame: Any) -> None:
        raise Hang(f"CLI call ran past {seconds} s")

    old = signal.signal(signal.SIGALRM, ring)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    TRIED[argv[0]] += 1
    with _alarm(SECONDS_PER_CALL):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def _check(code: int, out: str, err: str, argv: list[str]) -> dict[str, Any] | None:
    assert "Traceback" not in err and "Traceback" not in out, (argv, err)
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("rlfleet"), (argv, err)
        assert out == "", (argv, out)
        return None
    assert code == 0, (argv, code, err)
    SUCCEEDED[argv[0]] += 1
    return json.loads(out) if "--json" in argv else None


def _finite(obj: Any) -> bool:
    if isinstance(obj, dict):
        return all(_finite(v) for v in obj.values())
    if isinstance(obj, list):
        return all(_finite(v) for v in obj)
    return not isinstance(obj, float) or math.isfinite(obj)


@settings(max_examples=700, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                 HealthCheck.data_too_large, HealthCheck.large_base_example])
@given(files=scenario(), command=st.sampled_from(["validate", "validate", "simulate", "simulate", "plan"]))
def _fuzz_files(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                files: tuple[str, str, str], command: str) -> None:
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
    obj = _check(*_run(capsys, argv), argv)
    if obj is None:
        return
    assert _finite(obj), obj
    if command == "simulate":
        assert obj["samples_per_s"] >= 0 and obj["max_staleness"] <= json.loads(plan).get("staleness", 0)
    if command == "plan":
        cluster_gpus = sum(g["nodes"] * g.get("gpus_per_node", 8) for g in yaml.safe_load(cluster)["node_groups"])
        shared = obj["mode"] == "colocated"  # the trainer's GPUs also generate
        used = sum(r["train"] + (0 if shared else r["rollout"]) for r in obj["gpus"].values())
        assert obj["samples_per_s"] > 0 and 0 < used <= cluster_gpus


@settings(max_examples=1400, deadline=None, derandomize=True,
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
    argv.append("--json")
    obj = _check(*_run(capsys, argv), argv)
    if obj is not None:
        CHECKED[stage] += 1
        assert obj["seconds"] >= 0 and _finite(obj), obj


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
    obj = _check(*_run(capsys, argv), argv)
    assert obj is not None and obj["samples_per_s"] > 0
    assert time.monotonic() - t0 < SECONDS_PER_CALL
    argv = ["simulate", "--cluster", "traces/data/clusters/mixed-h800-h20-l40s.yaml", "--workload", str(job),
            "--plan", "traces/data/plans/mixed-math-short.json"]
    code, _, err = _run(capsys, argv)
    assert code == 2 and "at most 20,000,000" in err


def _counted(run: Any, commands: tuple[str, ...], *args: Any) -> tuple[int, Counter[str]]:
    """Run one fuzz function; return how many inputs it tried and what succeeded meanwhile."""
    tried, succeeded = sum(TRIED.values()), SUCCEEDED.copy()
    run(*args)
    gained = SUCCEEDED - succeeded
    print(f"fuzzed {sum(TRIED.values()) - tried} inputs; succeeded: {dict(gained)}; every other one: one line, exit 2")
    return sum(TRIED.values()) - tried, Counter({c: gained[c] for c in commands})


def test_cli_never_crashes_on_fuzzed_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tried, succeeded = _counted(_fuzz_files, ("validate", "simulate", "plan"), tmp_path, capsys)
    assert tried >= 650 and min(succeeded.values()) >= 5, (tried, succeeded)  # valid inputs exercised too


def test_costs_never_crash_on_fuzzed_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    checked = CHECKED.copy()
    tried, succeeded = _counted(_fuzz_costs, ("costs",), capsys)
    assert tried >= 1300 and succeeded["costs"] >= 5, (tried, succeeded)
    checked = CHECKED - checked
    assert all(checked[stage] >= 5 for stage in ("decode", "prefill", "train", "sync")), checked
