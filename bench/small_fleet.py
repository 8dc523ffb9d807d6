"""Small busy fleets for the simulator's speed (issue 19 point 1): few engines, each one busy.

Two cases, both async and interruptible: the README demo's plan (the plan `rlfleet plan` picks on
mixed-h800-h20-l40s for qwen2.5-7b-grpo-longtail: 32 H800 TP1 + 32 H20 TP4 engines) and the two
candidates that `rlfleet plan` spends most of its simulation time on there (12 and 14 engines).
Only sim and traces APIs that main has too, so bench/sim_compare.py --speed --small can time this
file against another tree.
Usage: python bench/small_fleet.py [--steps 10] [--repeat 3]
"""

from __future__ import annotations

import argparse
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    for case in CASES:
        timed(case, 1)  # loads the compiled kernels: not measured
        runs = sorted(timed(case, args.steps) for _ in range(max(1, args.repeat)))
        wall, sim_s, events, cpu = runs[len(runs) // 2]
        print(f"{case:12s} {args.steps} steps, median of {len(runs)}: wall {wall:.3f} s (cpu {cpu:.3f} s), "
              f"{events} events ({1e6 * wall / max(events, 1):.1f} us/event), {sim_s:,.0f} simulated s")


if __name__ == "__main__":
    main()
