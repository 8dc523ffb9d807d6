"""The baselines a plan is compared with, planned and simulated as the plan is, at its budget.

- homogeneous: for each kind of node, as many of its nodes as the budget buys (availability aside:
  such a baseline may need more GPUs than the fleet has, which the report marks);
- split 75/25 and 50/50: the plan's own GPUs, the trainer's whole nodes fixed at that share;
- colocated sync: one pool's GPUs take turns generating and training.
"""

from __future__ import annotations

import dataclasses
import math

from planner.candidates import Candidates
from planner.milp import Solution, solve_colocated
from planner.scoring import Scored, Search, Trial, for_mode
from traces import Cluster


def baselines(search: Search, chosen: Scored, budget: float) -> dict[str, Scored]:
    """Every baseline planned first, then all simulated side by side (Search.score_many)."""
    trials: dict[str, list[Trial]] = {"homogeneous": _homogeneous_trials(search, budget)}
    if chosen.solution.mode != "colocated":
        for share in (0.75, 0.5):
            split = _fixed_split(search, chosen.cand, chosen.solution, share)
            if split is not None:
                trials[f"split-{round(share * 100)}/{round((1 - share) * 100)}"] = [split]
    colo_workload = for_mode(search.workload, "colocated")
    colo_cand = search.candidates(workload=colo_workload)
    colo = solve_colocated(colo_cand, budget=budget)
    if colo:
        trials["colocated-sync"] = [Trial("colocated-sync", colo_cand, colo[0], workload=colo_workload)]
    flat = [t for ts in trials.values() for t in ts]
    scored = iter(search.score_many(flat, where="the baselines", counted=False))
    out: dict[str, Scored] = {}
    for name, ts in trials.items():
        best: Scored | None = None
        for s in (next(scored) for _ in ts):  # the homogeneous baseline: the fastest kind of node (first on ties)
            if s is not None and (best is None or s.samples_per_s > best.samples_per_s):
                best = s
        if best is not None:
            out[name] = best
    return out


def _homogeneous_trials(search: Search, budget: float) -> list[Trial]:
    """For each GPU type of the cluster: as many of its nodes as the budget buys (availability aside)."""
    cluster = search.cluster
    asked = []
    kinds = {(cluster.group_gpu(g), g.gpus_per_node, g.inter_node_gb_per_s): g for g in reversed(cluster.node_groups)}
    for group in reversed(kinds.values()):  # one baseline per kind of node, first group of each kind
        node_price = group.gpus_per_node * cluster.group_gpu(group).price_per_gpu_hour
        nodes = int(budget // node_price) if node_price > 0 else group.nodes
        if nodes < 1:
            continue
        only = Cluster(name=f"{group.gpu_type} x{nodes * group.gpus_per_node}", gpus=cluster.gpus,
                       node_groups=(group.model_copy(update={"nodes": nodes, "label": None}),))
        asked.append((f"homogeneous {group.gpu_type}", only, search.candidates(cluster=only)))
    kw = {"objective": "throughput", "restricted": False, "budget": budget, "target": None}
    answers = search.solve_many([(cand, search.workload.mode, 1, kw) for _, _, cand in asked])
    return [Trial(name, cand, found[0], cluster=only) for (name, only, cand), found in zip(asked, answers, strict=True)
            if found]


def _fixed_split(search: Search, cand: Candidates, sol: Solution, rollout_share: float) -> Trial | None:
    """The plan's own GPUs, with the trainer's whole nodes fixed at (1 - share) of them."""
    used = {sol.trainer.pool: sol.trainer.nodes * cand.pools[sol.trainer.pool].per_node}
    for o, n in sol.engines:
        used[o.pool] = used.get(o.pool, 0) + o.tp * n
    total = sum(used.values())
    sub_pools = tuple(dataclasses.replace(p, nodes=math.ceil(used.get(p.index, 0) / p.per_node))
                      for p in cand.pools)
    want = (1 - rollout_share) * total
    trainers = [t for t in cand.trainers if t.nodes <= sub_pools[t.pool].nodes]
    if not trainers:
        return None
    closest = min(abs(t.nodes * cand.pools[t.pool].per_node - want) for t in trainers)
    keep = tuple(t for t in trainers if abs(t.nodes * cand.pools[t.pool].per_node - want) == closest)
    sub = dataclasses.replace(cand, pools=sub_pools, trainers=keep)
    found = search.solve(sub, sol.mode, objective="throughput", restricted=False, budget=None, target=None)
    if not found:
        return None
    return Trial(f"split {round(rollout_share * 100)}/{round((1 - rollout_share) * 100)}", cand, found[0])
