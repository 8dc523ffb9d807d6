"""The planner's analytic agentic rate against the simulator, per staleness (and sync mode).

Setup of tests/test_agentic_planner.py: qwen2.5-1.5b on 8 H800 + 8 H20, 1-4 turns, lognormal tool
latency (mean 2 s, sigma 1, cap 30 s); the plan is the planner's throughput pick at each staleness.
Usage: python bench/agentic_rate_vs_sim.py [--steps 12] [--sigma 1.0]
"""

from __future__ import annotations

import argparse

from planner.candidates import candidates
from planner.milp import solve
from planner.placement import reprice_sync, to_plan
from sim import simulate
from traces import Cluster, CostModel, get_model
from traces.agentic import Agentic, SecondsDist
from traces.lengths import LengthDist
from traces.workload import Workload

CLUSTER = Cluster(name="c", node_groups=({"gpu_type": "H800", "nodes": 1, "gpus_per_node": 8},
                                         {"gpu_type": "H20", "nodes": 1, "gpus_per_node": 8}))


def workload(eta: float, mode: str, sigma: float, mean: float, cap: float) -> Workload:
    tools = Agentic(turns=LengthDist(kind="uniform", low=1, high=4),
                    tool_latency=SecondsDist(kind="lognormal", mean=mean, sigma=sigma, cap=cap),
                    tool_tokens=LengthDist(kind="lognormal", mean=200, sigma=1.0, cap=1024))
    return Workload(model=get_model("qwen2.5-1.5b"), prompts_per_step=32, group_size=8,
                    prompt_len=LengthDist(kind="uniform", low=64, high=256),
                    response_len=LengthDist(kind="lognormal", mean=400, sigma=1.0, cap=2048), mode=mode,
                    staleness=eta, reward_seconds=0.01, agentic=tools)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--sigma", type=float, default=1.0)
    p.add_argument("--mean", type=float, default=2.0)
    p.add_argument("--cap", type=float, default=30.0)
    args = p.parse_args()
    cm = CostModel()
    print("mode   eta  analytic  simulated  ratio")
    for mode, eta in (("async", 4), ("async", 2), ("async", 1), ("sync", 0)):
        w = workload(eta, mode, args.sigma, args.mean, args.cap)
        cand = candidates(cm, CLUSTER, w)
        found = solve(cand, w.mode, "throughput", None, None, 1, "auto")
        plan = to_plan(CLUSTER, w, cand, found[0])
        analytic = reprice_sync(cm, CLUSTER, w, cand, found[0], plan).samples_per_s
        simulated = simulate(CLUSTER, w, plan, cm, steps=args.steps, seed=0, record_queue=False).samples_per_s
        print(f"{mode:6s} {eta:3g}  {analytic:8.2f}  {simulated:9.2f}  {analytic / simulated:5.3f}")


if __name__ == "__main__":
    main()
