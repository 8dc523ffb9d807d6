"""Issue 14's two-type acceptance with vLLM engines in the loop: `rlfleet run --engine vllm` of a plan
whose rollout groups (2 and 1 engines) sit on cpu-a nodes 1 and 0 and whose trainer sits on cpu-b
node 2 of a fake-node Ray cluster (the same fixtures as test_runtime_place.py, with the tiny-llama-h32
model: vLLM's CPU kernels take head sizes of 32 and up). Slow: three vLLM engines start on 2 cores.
"""

from __future__ import annotations

import importlib.util
import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

DATA = Path("tests/data/place")
STEPS, GROUPS, GROUP_SIZE = 30, 16, 16


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed (make test installs it)")
def test_two_type_plan_runs_vllm_engines_on_its_nodes(cli: Callable[..., Any], write: Callable[[str, str], Path],
                                                       tmp_path: Path) -> None:
    plan = json.loads((DATA / "two-type-async.json").read_text())
    plan_file = write("plan.json", json.dumps({**plan, "model": "tiny-llama-h32"}))
    workload = write("w.yaml", (DATA / "addition-async.yaml").read_text().replace("model: tiny-llama\n",
                                                                                   "model: tiny-llama-h32\n"))
    out = tmp_path / "run"
    res = cli("run", str(plan_file), "--cluster", str(DATA / "two-type-cluster.yaml"), "--workload", str(workload),
              "--engine", "vllm", "--steps", str(STEPS), "--out", str(out), "--json")
    assert res.code == 0, res.err[-3000:]
    run = res.json()
    assert (run["engine"], run["executor"], run["steps"]) == ("vllm", "ray-local", STEPS)
    assert [a["engine"] for a in run["engine_actors"]] == ["VllmEngine"] * 3
    # every actor on a node of its group's type and on the node the plan assigned it
    where = json.loads((out / "placement.json").read_text())
    planned = {f"rollout{i}": set(g["nodes"]) for i, g in enumerate(plan["rollout"])}
    planned["trainer"] = set(plan["trainer"]["nodes"])
    types = {f"rollout{i}": g["gpu_type"] for i, g in enumerate(plan["rollout"])} | {
        "trainer": plan["trainer"]["gpu_type"]}
    assert sorted(a["group"] for a in where["actors"]) == ["rollout0", "rollout0", "rollout1", "trainer"]
    for actor in where["actors"]:
        assert actor["node_index"] in planned[actor["group"]] and actor["node_gpu_type"] == types[actor["group"]]
    # the bound held, nothing lost or trained twice, and the reward rose
    assert run["max_staleness"] <= run["staleness_bound"] == 2
    assert run["samples_trained"] == STEPS * GROUPS * GROUP_SIZE
    assert run["samples_regenerated"] == 0 and run["duplicates_dropped"] == 0
    rewards = [json.loads(line)["mean_reward"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    print(f"\nvLLM two-type run: reward first ten {statistics.mean(rewards[:10]):.4f} -> last ten "
          f"{statistics.mean(rewards[-10:]):.4f}; eval {run['eval_before']:.4f} -> {run['eval_after']:.4f}")
    assert statistics.mean(rewards[-10:]) > 2 * statistics.mean(rewards[:10])
    assert run["eval_after"] > run["eval_before"]
