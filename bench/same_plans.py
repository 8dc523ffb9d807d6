"""Whether this tree plans what an older commit planned: the shipped examples and 10 seeded random fleets.

Each tree plans every case with `planner.plan_report`'s defaults (re-ranking, baselines, marginal
values) in its own subprocess; the chosen plans (rollout, trainer, mode) and their simulated
samples/s are compared, and each tree's time is printed side by side.
Usage: python bench/same_plans.py [--base REV] [--random N]
  (the older commit is checked out with `git worktree add` under /tmp/speed-base-REV)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from base_tree import base_tree  # bench/base_tree.py: bench/ is the script folder, first on sys.path

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = [("mixed-h800-h20-l40s", "qwen2.5-7b-grpo-longtail"), ("h800-h20-l40s-4node", "qwen2.5-1.5b-math-short"),
           ("a100-l4", "llama-3.1-8b-grpo-4k"), ("h100-64", "qwen2.5-7b-grpo-longtail"),
           ("h800-h20-l40s-4node", "qwen3-30b-a3b-grpo")]
RANDOM_TYPES = ["H800", "H20", "L40S", "A100-80G", "H100", "L4"]


def cases(n_random: int) -> list[dict[str, Any]]:
    """Shipped cluster x workload pairs, then `n_random` seeded fleets of 2-3 types, 1-4 nodes each."""
    import numpy as np

    out: list[dict[str, Any]] = [{"cluster": f"traces/data/clusters/{c}.yaml",
                                  "workload": f"traces/data/workloads/{w}.yaml"} for c, w in SHIPPED]
    rng = np.random.default_rng(19)
    for i in range(n_random):
        types = rng.choice(RANDOM_TYPES, size=int(rng.integers(2, 4)), replace=False)
        groups = [{"gpu_type": str(t), "nodes": int(rng.integers(1, 5))} for t in types]
        out.append({"groups": groups, "model": str(rng.choice(["qwen2.5-1.5b", "qwen2.5-7b"])), "name": f"random-{i}"})
    return out


def _load(case: dict[str, Any]) -> tuple[Any, Any]:
    from traces import Cluster, Workload, get_model, load_cluster, load_workload
    from traces.lengths import LengthDist

    if "cluster" in case:
        return load_cluster(str(ROOT / case["cluster"])), load_workload(str(ROOT / case["workload"]))
    cluster = Cluster(name=case["name"], node_groups=tuple(case["groups"]))
    workload = Workload(name=case["name"], model=get_model(case["model"]), prompts_per_step=32, group_size=8,
                        prompt_len=LengthDist(kind="lognormal", mean=400, sigma=0.5, cap=1024),
                        response_len=LengthDist(kind="lognormal", mean=1500, sigma=0.9, cap=6144),
                        staleness=2, interruptible=True, ppo_minibatches=2)
    return cluster, workload


def worker(case_json: str) -> None:
    """Plan each case in this process (the tree on PYTHONPATH) and print one JSON line per case."""
    from planner.api import plan_report

    for case in json.loads(case_json):
        cluster, workload = _load(case)
        t0 = time.perf_counter()
        try:
            r = plan_report(cluster, workload)
            plan = r.plan.model_dump(mode="json", exclude={"predicted"})
            row = {"plan": plan, "samples_per_s": r.chosen.samples_per_s, "marginal": r.marginal,
                   "baselines": {k: b.samples_per_s for k, b in r.baselines.items()}}
        except Exception as err:  # a case the planner refuses is compared by its message
            row = {"error": str(err)}
        row["seconds"] = time.perf_counter() - t0
        print(json.dumps(row), flush=True)


def run_tree(tree: Path, todo: list[dict[str, Any]]) -> list[dict[str, Any]]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(todo)], env=env,
                         cwd=tree, capture_output=True, text=True, check=True)
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="6d4c25d", help="the commit to compare with (default: before issue 19's work)")
    ap.add_argument("--random", type=int, default=10, help="seeded random fleets (default 10)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker)
        return
    todo = cases(args.random)
    old, new = run_tree(base_tree(args.base), todo), run_tree(ROOT, todo)
    same = 0
    print(f"{'case':<44} {'old s':>6} {'new s':>6} {'old samples/s':>13} {'new samples/s':>13} same plan")
    for case, a, b in zip(todo, old, new, strict=True):
        name = case.get("name") or f"{Path(case['cluster']).stem} x {Path(case['workload']).stem}"
        equal = a.get("plan", a.get("error")) == b.get("plan", b.get("error"))
        same += equal
        print(f"{name:<44} {a['seconds']:>6.2f} {b['seconds']:>6.2f} {a.get('samples_per_s', float('nan')):>13.3f} "
              f"{b.get('samples_per_s', float('nan')):>13.3f} {'yes' if equal else 'NO'}")
    print(f"same plans: {same} of {len(todo)}; total {sum(a['seconds'] for a in old):.1f} s old, "
          f"{sum(b['seconds'] for b in new):.1f} s new")


if __name__ == "__main__":
    main()
