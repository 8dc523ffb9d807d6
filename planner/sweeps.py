"""What-if sweeps over plans: variants of a fleet and job (`what_if`), the cost/throughput frontier (`pareto`).

Each variant is planned exactly as `planner.api.plan_report` plans (the baseline row is its answer).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from planner.api import plan_report
from planner.bounds import Deadline
from planner.candidates import candidates
from planner.explain import explain_empty
from planner.milp import solve
from planner.placement import to_plan
from planner.scoring import Search
from traces import Cluster, CostModel, NodeGroup, Plan, SpecError, Workload
from traces.io import validate
from traces.progress import bar


def pareto(cluster: Cluster, workload: Workload, *, points: int = 8, cost_model: CostModel | None = None,
           solver: str = "auto", sim_steps: int = 0, seed: int = 0) -> pd.DataFrame:
    """Min-cost plans for targets from 10% to 100% of the fleet's analytic maximum.

    The frontier is the MILP's (analytic): `samples_per_s` is what the analytic model promises. With
    `sim_steps` > 0 each point is also simulated (`simulated_samples_per_s`), so a frontier that
    disagrees with `plan`'s simulated answer says so in its own table.
    """
    cm = cost_model or CostModel()
    if not 2 <= points <= 200:
        raise SpecError(f"points must be between 2 and 200, got {points}")
    cand = candidates(cm, cluster, workload)
    top = solve(cand, workload.mode, "throughput", None, None, 1, solver)
    if not top:
        explain_empty(cm, cluster, workload, cand, workload.mode, "throughput", None, None, solver)
    search = Search(cm, cluster, workload, "cost", None, None, solver, sim_steps, seed,
                    deadline=Deadline(simulations=points))  # each point simulated once, under one clock
    rows = []
    for frac in _tick_all(np.linspace(0.1, 1.0, points), "pareto sweep"):
        target = float(frac * top[0].samples_per_s) * (1 - 1e-6)
        found = solve(cand, workload.mode, "cost", None, target, 1, solver)
        if found:
            s = found[0]
            row = {"target": target, "samples_per_s": s.samples_per_s, "cost_per_hour": s.cost_per_hour,
                   "cost_per_1k_samples": s.cost_per_hour / 3.6 / s.samples_per_s, "gap": s.gap}
            scored = search.score("pareto", cand, s, where="the pareto sweep") if sim_steps > 0 else None
            if scored is not None:
                row["simulated_samples_per_s"] = scored.samples_per_s
            rows.append({**row, **_gpu_columns(to_plan(cluster, workload, cand, s))})
    return pd.DataFrame(rows).fillna(0)


def _tick_all(items: Any, desc: str) -> Any:
    items = list(items)
    with bar(len(items), desc) as progress:
        for item in items:
            yield item
            progress.update()


def _gpu_columns(plan: Plan) -> dict[str, int]:
    return {f"{t}_{role}": n for t, roles in plan.gpus_by_type.items() for role, n in roles.items() if n}


@dataclass(frozen=True)
class Change:
    """One what-if variant: GPUs added (negative: removed) per type, and workload edits."""

    name: str
    gpus: dict[str, int] = field(default_factory=dict)  # gpu type -> GPUs to add (whole nodes)
    workload: dict[str, Any] = field(default_factory=dict)  # Workload fields to replace
    budget: float | None = None


def what_if(cluster: Cluster, workload: Workload, changes: list[Change | dict[str, Any]], *,
            cost_model: CostModel | None = None, sim_steps: int | None = None, seed: int = 0, solver: str = "auto",
            budget: float | None = None, top_k: int = 3) -> pd.DataFrame:
    """One row per variant (the unchanged fleet first): plan it as `plan` would (same search, same
    defaults: its baseline row is `plan`'s answer), simulate it, report it."""
    cm = cost_model or CostModel()
    variants = [Change("baseline")] + [c if isinstance(c, Change) else Change(**c) for c in changes]
    rows = []
    for change in _tick_all(variants, "what-if variants"):
        c2, w2 = apply_change(cluster, workload, change)
        spend = change.budget if change.budget is not None else budget
        try:
            r = plan_report(c2, w2, budget=spend, top_k=top_k, cost_model=cm, solver=solver, sim_steps=sim_steps,
                            seed=seed, baselines=False, marginal=False)
        except SpecError as exc:
            rows.append({"variant": change.name, "samples_per_s": 0.0, "note": str(exc)})
            continue
        s = r.summary()
        rows.append({"variant": change.name, "samples_per_s": s["samples_per_s"],
                     "analytic_samples_per_s": s["analytic_samples_per_s"], "cost_per_hour": s["cost_per_hour"],
                     "cost_per_1k_samples": s["cost_per_1k_samples"], "bottleneck": s["bottleneck"],
                     **_gpu_columns(r.plan), "note": ""})
    return pd.DataFrame(rows).fillna(0)


def apply_change(cluster: Cluster, workload: Workload, change: Change) -> tuple[Cluster, Workload]:
    groups = list(cluster.node_groups)
    for gpu_type, delta in change.gpus.items():
        name = cluster.resolve(gpu_type).name
        mine = [i for i, g in enumerate(groups) if cluster.resolve(g.gpu_type).name == name]
        if not mine:
            if delta <= 0:
                raise SpecError(f"what-if '{change.name}': the cluster has no {name} GPUs to remove")
            groups.append(NodeGroup(gpu_type=name, nodes=-(-delta // 8)))
            continue
        g = groups[mine[0]]
        nodes = g.nodes + (delta // g.gpus_per_node if delta >= 0 else -(-delta // g.gpus_per_node))
        if delta % g.gpus_per_node:
            raise SpecError(f"what-if '{change.name}': {name} comes in nodes of {g.gpus_per_node} GPUs; "
                            f"add or remove a multiple of {g.gpus_per_node}")
        if nodes < 0:
            raise SpecError(f"what-if '{change.name}': cannot remove {-delta} {name} GPUs, the cluster has {g.gpus}")
        if nodes == 0:
            groups.pop(mine[0])
        else:
            groups[mine[0]] = g.model_copy(update={"nodes": nodes})
    if not groups:
        raise SpecError(f"what-if '{change.name}' removes every GPU")
    c2 = Cluster(name=f"{cluster.name}+{change.name}", gpus=cluster.gpus, node_groups=tuple(groups),
                 links=cluster.links)
    w2 = workload
    if change.workload:
        data = {**workload.model_dump(), **change.workload}
        w2 = validate(Workload, data, f"what-if '{change.name}'")
    return c2, w2
