"""A tiny simulation that loads the simulator's compiled kernels (numba, cached on disk) in this process.

Loading them takes about half a second in each new process, paid by its first simulation; a
planner's worker processes run this while the request's own MILP is solved, so their first
simulations of the request do not wait for it (planner.parallel.Simulations.start). Nothing it
computes is kept: the kernels' dispatch tables are the only state it leaves.
"""

from __future__ import annotations

from sim.simulate import simulate
from traces import Cluster, CostModel, Plan, RolloutGroup, TrainerGroup, Workload, get_model
from traces.lengths import LengthDist


def warm_up() -> float:
    """Simulate two steps of a two-node asynchronous, interruptible plan (the planner's usual kind);
    returns its samples/s, which nobody needs."""
    cluster = Cluster(name="warm-up", node_groups=({"gpu_type": "H800", "nodes": 2},))
    workload = Workload(name="warm-up", model=get_model("qwen2.5-1.5b"), prompts_per_step=4, group_size=2,
                        prompt_len=LengthDist(kind="uniform", low=64, high=128),
                        response_len=LengthDist(kind="lognormal", mean=200, sigma=0.5, cap=512),
                        staleness=1, interruptible=True)
    plan = Plan(mode="async", staleness=1, rollout=(RolloutGroup(gpu_type="H800", instances=8),),
                trainer=TrainerGroup(gpu_type="H800", dp=8))
    return simulate(cluster, workload, plan, CostModel.roofline_only(), steps=2, seed=0).samples_per_s
