"""Placement: concrete nodes for a MILP solution, and the plan it becomes.

The trainer takes the first nodes of its pool (a pool's nodes are identical, and the trainer's pool
was chosen by the MILP, so these are as well connected as any); engines fill the remaining nodes
of each pool in order, `per_node / tp` to a node. Weight sync is then re-priced on the real links
(traces.links, the path the simulator prices too).
"""

from __future__ import annotations

import dataclasses

from planner.candidates import Candidates, EngineOption, Pool
from planner.milp import Solution, evaluate
from traces import Cluster, CostModel, Plan, RolloutGroup, TrainerGroup, Workload
from traces.links import sync_path_bytes_per_s


def _nodes_for_engines(pool: Pool, skip: int, counts: list[tuple[EngineOption, int]]) -> list[tuple[int, ...]]:
    """Node indices per engine option, filling the pool's nodes after the first `skip`."""
    at, free = skip, pool.per_node
    out = []
    for option, count in counts:
        used: list[int] = []
        for _ in range(count):
            if free < option.tp:
                at, free = at + 1, pool.per_node
            used.append(pool.node_ids[at])
            free -= option.tp
        out.append(tuple(sorted(set(used))))
    return out


def reprice_sync(cm: CostModel, cluster: Cluster, workload: Workload, cand: Candidates, solution: Solution,
                 plan: Plan) -> Solution:
    """The solution with weight sync priced on its placed plan's real links and engine count."""
    engines = sum(n for _, n in solution.engines)
    t_gpu = cand.pools[solution.trainer.pool].gpu
    real = float(cm.sync(t_gpu, workload.model, engines, sync_path_bytes_per_s(cluster, plan),
                         workload.lora_rank).seconds)
    step = solution.trainer.step_seconds - cand.sync_seconds + real
    trainer = dataclasses.replace(solution.trainer, step_seconds=step, samples_per_s=cand.samples_per_step / step)
    rate, gen, train, tail, cost = evaluate(cand, trainer, solution.engines, solution.mode)
    return dataclasses.replace(solution, trainer=trainer, samples_per_s=rate, generation_per_s=gen,
                               training_per_s=train, tail_per_s=tail, cost_per_hour=cost)


def to_plan(cluster: Cluster, workload: Workload, cand: Candidates, solution: Solution,
            predicted: dict[str, float] | None = None) -> Plan:
    t = solution.trainer
    t_pool = cand.pools[t.pool]
    trainer = TrainerGroup(gpu_type=t_pool.gpu.name, dp=t.dp, tp=t.tp, pp=t.pp, ep=t.ep, zero_stage=t.zero_stage,  # type: ignore[arg-type]
                           recompute=t.recompute, nodes=t_pool.node_ids[: t.nodes])  # type: ignore[arg-type]
    rollout: list[RolloutGroup] = []
    for pool in cand.pools:
        counts = [(o, n) for o, n in solution.engines if o.pool == pool.index]
        if not counts:
            continue
        skip = 0 if solution.mode == "colocated" or pool.index != t.pool else t.nodes
        for (option, n), nodes in zip(counts, _nodes_for_engines(pool, skip, counts), strict=True):
            rollout.append(RolloutGroup(gpu_type=pool.gpu.name, tp=option.tp, ep=option.ep, instances=n, nodes=nodes))
    return Plan(cluster=cluster.name, workload=workload.name, model=workload.model.name, mode=solution.mode,
                staleness=cand.staleness if solution.mode == "async" else 0, rollout=tuple(rollout), trainer=trainer,
                predicted=predicted or {})
