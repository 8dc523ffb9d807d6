"""End-to-end planning time by fleet size, GPU types and model size; HiGHS vs CBC side by side.

For 64, 1024 and 8192 GPUs spread over 4-8 GPU types and three models (qwen2.5-1.5b, qwen2.5-7b,
qwen2.5-32b), it times `planner.plan_report` without re-ranking (candidates + MILP + placement)
and with top-5 simulator re-ranking, and the MILP alone under HiGHS and under CBC in the same run.
Usage: python bench/plan_speed.py [--quick]
"""

from __future__ import annotations

import argparse
import time

from planner.api import plan_report
from planner.candidates import candidates
from planner.milp import solve_async_fixed
from traces import Cluster, CostModel, Workload, get_model
from traces.lengths import LengthDist

TYPES = ["H800", "H20", "L40S", "A100-80G", "H100", "H200", "A10G", "L4"]


def fleet(gpus: int, types: int) -> Cluster:
    """`gpus` GPUs in 8-GPU nodes, spread as evenly as whole nodes allow over the first `types` types."""
    nodes = gpus // 8
    counts = [nodes // types + (1 if i < nodes % types else 0) for i in range(types)]
    groups = tuple({"gpu_type": t, "nodes": n} for t, n in zip(TYPES[:types], counts, strict=True))
    return Cluster(name=f"bench-{gpus}", node_groups=groups)


def workload(model: str) -> Workload:
    return Workload(name=f"bench-{model}", model=get_model(model), prompts_per_step=64, group_size=16,
                    prompt_len=LengthDist(kind="lognormal", mean=400, sigma=0.5, cap=1024),
                    response_len=LengthDist(kind="lognormal", mean=2000, sigma=0.9, cap=8192),
                    staleness=4, interruptible=True, ppo_minibatches=4)


def timed(fn, *args, **kw):  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    out = fn(*args, **kw)
    return out, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="skip the 8192-GPU rows and the re-ranking at 8192")
    args = ap.parse_args()
    cm = CostModel()
    print(f"{'GPUs':>5} {'types':>5} {'model':<13} {'plan s':>7} {'+top-5 sim s':>12} {'gap':>8} "
          f"{'HiGHS s':>8} {'CBC s':>7} {'CBC/HiGHS':>9} {'samples/s':>9}")
    cases = [(64, 4), (1024, 6), (8192, 8)]
    for gpus, types in cases[:2] if args.quick else cases:
        cluster = fleet(gpus, types)
        for model in ("qwen2.5-1.5b", "qwen2.5-7b", "qwen2.5-32b"):
            w = workload(model)
            fast, t_plan = timed(plan_report, cluster, w, top_k=1, cost_model=cm, sim_steps=0, baselines=False,
                                 marginal=False)
            t_sim = float("nan")
            if gpus <= 1024:
                _, t_sim = timed(plan_report, cluster, w, top_k=5, cost_model=cm, sim_steps=4, baselines=False,
                                 marginal=False)
            cand = candidates(cm, cluster, w)
            _, t_highs = timed(solve_async_fixed, cand, solver_name="highs")
            _, t_cbc = timed(solve_async_fixed, cand, solver_name="cbc")
            print(f"{cluster.total_gpus:>5} {types:>5} {model:<13} {t_plan:>7.2f} {t_sim:>12.2f} "
                  f"{fast.chosen.solution.gap:>8.2e} {t_highs:>8.3f} {t_cbc:>7.3f} {t_cbc / t_highs:>9.1f} "
                  f"{fast.chosen.solution.samples_per_s:>9.1f}")


if __name__ == "__main__":
    main()
