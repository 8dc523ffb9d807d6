"""What-if sweeps over plans: variants of a fleet and job (`what_if`), the cost/throughput frontier (`pareto`).

Each variant is planned exactly as `planner.api.plan_report` plans (the baseline row is its answer).
Variants and frontier points are independent jobs: they run on `executor=` (planner.executors: local
processes by default, Ray for large sweeps), with the same table wherever they ran.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from planner.api import plan_report
from planner.bounds import Deadline
from planner.candidates import Candidates, candidates
from planner.executors import Executor, Job, run
from planner.explain import explain_empty
from planner.milp import solve
from planner.placement import to_plan
from planner.scoring import Search
from traces import Cluster, CostModel, NodeGroup, Plan, SpecError, Workload
from traces.io import validate


def pareto(cluster: Cluster, workload: Workload, *, points: int = 8, cost_model: CostModel | None = None,
           solver: str = "auto", sim_steps: int = 0, seed: int = 0,
           executor: Executor | str | None = None) -> pd.DataFrame:
    """Min-cost plans for targets from 10% to 100% of the fleet's analytic maximum.

    The frontier is the MILP's (analytic): `samples_per_s` is what the analytic model promises. With
    `sim_steps` > 0 each point is also simulated (`simulated_samples_per_s`, by a settling run), so a frontier that
    disagrees with `plan`'s simulated answer says so in its own table. Points run on `executor`.
    """
    cm = cost_model or CostModel()
    if not 2 <= points <= 200:
        raise SpecError(f"points must be between 2 and 200, got {points}")
    cand = candidates(cm, cluster, workload)
    top = solve(cand, workload.mode, "throughput", None, None, 1, solver)
    if not top:
        explain_empty(cm, cluster, workload, cand, workload.mode, "throughput", None, None, solver)
    targets = [float(frac * top[0].samples_per_s) * (1 - 1e-6) for frac in np.linspace(0.1, 1.0, points)]
    payload = {"cluster": cluster.model_dump(mode="json"), "workload": workload.model_dump(mode="json"),
               "cost_model": cm, "cand": cand, "solver": solver, "sim_steps": sim_steps, "seed": seed,
               "points": points}
    rows = run(Job(_pareto_search, _pareto_point, payload), targets, _light(executor, sim_steps), "pareto sweep")
    return pd.DataFrame([r for r in rows if r is not None]).fillna(0)


@dataclass(frozen=True)
class _Frontier:
    search: Search
    cand: Candidates


def _pareto_search(payload: dict[str, Any]) -> _Frontier:
    cluster, workload = Cluster.model_validate(payload["cluster"]), Workload.model_validate(payload["workload"])
    search = Search(payload["cost_model"], cluster, workload, "cost", None, None, payload["solver"],
                    payload["sim_steps"], payload["seed"],
                    # each point screened and settled once, in turn: no settling runs held back
                    deadline=Deadline(simulations=2 * payload["points"], reserve=0))
    return _Frontier(search, payload["cand"])


def _pareto_point(frontier: _Frontier, target: float) -> dict[str, Any] | None:
    """The cheapest plan reaching `target` (None: the MILP finds none)."""
    search, cand = frontier.search, frontier.cand
    found = solve(cand, search.workload.mode, "cost", None, target, 1, search.solver)
    if not found:
        return None
    s = found[0]
    row = {"target": target, "samples_per_s": s.samples_per_s, "cost_per_hour": s.cost_per_hour,
           "cost_per_1k_samples": s.cost_per_hour / 3.6 / s.samples_per_s, "gap": s.gap}
    scored = search.score("pareto", cand, s, where="the pareto sweep") if search.sim_steps > 0 else None
    if scored is not None:  # settled, as `plan` judges its answer (planner.confirm)
        row["simulated_samples_per_s"] = search.settle_many([scored], where="the pareto sweep")[0].samples_per_s
    return {**row, **_gpu_columns(to_plan(search.cluster, search.workload, cand, s))}


def _light(executor: Executor | str | None, sim_steps: int | None) -> Executor | str | None:
    """A sweep that simulates nothing is MILP solves of a fraction of a second each, less than a worker
    process takes to start (seconds): it runs here unless an executor is asked for."""
    return "serial" if executor is None and sim_steps is not None and sim_steps <= 0 else executor


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
            budget: float | None = None, top_k: int = 3, executor: Executor | str | None = None) -> pd.DataFrame:
    """One row per variant (the unchanged fleet first): plan it as `plan` would (same search, same
    defaults: its baseline row is `plan`'s answer), simulate it, report it. Variants run on `executor`."""
    cm = cost_model or CostModel()
    variants = [Change("baseline")] + [c if isinstance(c, Change) else Change(**c) for c in changes]
    items = []
    for change in variants:  # a change that cannot apply is the caller's error, before anything runs
        c2, w2 = apply_change(cluster, workload, change)
        items.append({"name": change.name, "cluster": c2.model_dump(mode="json"),
                      "workload": w2.model_dump(mode="json"),
                      "budget": change.budget if change.budget is not None else budget})
    payload = {"cost_model": cm, "sim_steps": sim_steps, "seed": seed, "solver": solver, "top_k": top_k}
    rows = run(Job(_same, _what_if_row, payload), items, _light(executor, sim_steps), "what-if variants")
    return pd.DataFrame(rows).fillna(0)


def _same(payload: dict[str, Any]) -> dict[str, Any]:
    return payload


def _what_if_row(shared: dict[str, Any], item: dict[str, Any]) -> dict[str, Any]:
    """One variant planned as `plan` plans it; a variant that cannot be planned is a row with its reason."""
    cluster, workload = Cluster.model_validate(item["cluster"]), Workload.model_validate(item["workload"])
    try:
        r = plan_report(cluster, workload, budget=item["budget"], top_k=shared["top_k"],
                        cost_model=shared["cost_model"], solver=shared["solver"], sim_steps=shared["sim_steps"],
                        seed=shared["seed"], baselines=False, marginal=False)
    except SpecError as exc:
        return {"variant": item["name"], "samples_per_s": 0.0, "bottleneck": "", "note": str(exc)}
    s = r.summary()
    return {"variant": item["name"], "samples_per_s": s["samples_per_s"],
            "analytic_samples_per_s": s["analytic_samples_per_s"], "cost_per_hour": s["cost_per_hour"],
            "cost_per_1k_samples": s["cost_per_1k_samples"], "bottleneck": s["bottleneck"],
            **_gpu_columns(r.plan), "note": ""}


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
