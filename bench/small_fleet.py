"""Small busy fleets for the simulator's speed (issue 19 point 1): few engines, each one busy.

Two cases, both async and interruptible: the README demo's plan (the plan `rlfleet plan` picks on
mixed-h800-h20-l40s for qwen2.5-7b-grpo-longtail: 32 H800 TP1 + 32 H20 TP4 engines) and the two
candidates that `rlfleet plan` spends most of its simulation time on there (12 and 14 engines).
Only sim and traces APIs that main has too, so `--against TREE` can run this file's cases in
another tree's code.
Usage: python bench/small_fleet.py [--steps 10] [--repeat 3] [--against TREE]
(--against: this tree and TREE, e.g. main exported with git archive, in alternating processes, with the ratio)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from sim import simulate
from traces import Cluster, CostModel, Plan, RolloutGroup, TrainerGroup, load_cluster, load_workload
from traces.workload import Workload

DATA = Path(__file__).resolve().parent.parent / "traces" / "data"


def demo() -> tuple[Cluster, Workload, Plan]:
    cluster = load_cluster(DATA / "clusters" / "mixed-h800-h20-l40s.yaml")
    workload = load_workload(DATA / "workloads" / "qwen2.5-7b-grpo-longtail.yaml")
    plan = Plan(mode="async", staleness=4,
                rollout=(RolloutGroup(gpu_type="H800", tp=1, instances=32),
                         RolloutGroup(gpu_type="H20", tp=4, instances=32)),
                trainer=TrainerGroup(gpu_type="H800", dp=32))
    return cluster, workload, plan


def twelve_engines() -> tuple[Cluster, Workload, Plan]:
    """The demo's slowest candidate (seen in `rlfleet plan`): 12 busy H800 TP4 engines, trainer dp16."""
    cluster, workload, _ = demo()
    plan = Plan(mode="async", staleness=4, rollout=(RolloutGroup(gpu_type="H800", tp=4, instances=12),),
                trainer=TrainerGroup(gpu_type="H800", dp=16))
    return cluster, workload, plan


def fourteen_engines() -> tuple[Cluster, Workload, Plan]:
    """The demo's second slowest candidate: 13 H800 TP1 engines and one TP2, trainer dp8."""
    cluster, workload, _ = demo()
    plan = Plan(mode="async", staleness=4,
                rollout=(RolloutGroup(gpu_type="H800", tp=1, instances=13),
                         RolloutGroup(gpu_type="H800", tp=2, instances=1)),
                trainer=TrainerGroup(gpu_type="H800", dp=8))
    return cluster, workload, plan


CASES = {"demo": demo, "12-engines": twelve_engines, "14-engines": fourteen_engines}


def timed(case: str, steps: int) -> tuple[float, float, int, float]:
    """Wall seconds, simulated seconds, events, CPU seconds (as bench/sim_speed.timed)."""
    cluster, workload, plan = CASES[case]()
    t0, c0 = time.perf_counter(), time.process_time()
    r = simulate(cluster, workload, plan, CostModel(), steps=steps, seed=0, record_queue=False)
    return time.perf_counter() - t0, r.sim_seconds, r.events, time.process_time() - c0


def medians(steps: int, repeat: int) -> dict[str, tuple[float, float, int, float]]:
    """Each case's median run (by wall), after a 1-step warm-up that loads the compiled kernels."""
    out = {}
    for case in CASES:
        timed(case, 1)
        runs = sorted(timed(case, steps) for _ in range(max(1, repeat)))
        out[case] = runs[len(runs) // 2]
    return out


def in_tree(tree: Path, steps: int, repeat: int) -> dict[str, list[float]]:
    """medians() in a process whose sim and traces come from `tree` (this file's cases, that tree's code)."""
    code = (f"import json, sys; sys.path.insert(0, {str(Path(__file__).resolve().parent)!r}); import small_fleet; "
            f"print(json.dumps(small_fleet.medians({steps}, {repeat})))")
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", code], check=True, env=env, cwd=tree, capture_output=True, text=True)
    return json.loads(out.stdout.splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--against", help="another tree to time side by side (3 rounds, alternating)")
    args = ap.parse_args()
    if args.against:
        trees = {"base": Path(args.against), "this": Path(__file__).resolve().parent.parent}
        got: dict[str, list[dict[str, list[float]]]] = {name: [] for name in trees}
        for r in range(3):  # a shared machine's load drifts: alternate the trees
            for name in (list(trees) if r % 2 == 0 else list(trees)[::-1]):
                got[name].append(in_tree(trees[name], args.steps, args.repeat))
        for case in CASES:
            base, this = (sorted(x[case][0] for x in got[n])[1] for n in trees)  # median wall of 3 rounds
            events = [got[n][0][case][2] for n in trees]
            print(f"{case:12s} base {base:.3f} s  this {this:.3f} s  ratio {base / this:.2f}x  events {events}")
        return
    for case, (wall, sim_s, events, cpu) in medians(args.steps, args.repeat).items():
        print(f"{case:12s} {args.steps} steps, median of {args.repeat}: wall {wall:.3f} s (cpu {cpu:.3f} s), "
              f"{events} events ({1e6 * wall / max(events, 1):.1f} us/event), {sim_s:,.0f} simulated s")


if __name__ == "__main__":
    main()
