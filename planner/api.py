"""`planner.plan`: candidates -> MILP -> placement -> simulator re-rank, with baselines and reasons.

The MILP ranks allocations by an analytic model (planner.milp); the best K distinct ones are placed
and simulated, and the best simulated one wins. Baselines are planned and simulated the same way
at the same budget, so the comparison is like for like.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from planner.candidates import Candidates, candidates
from planner.explain import check_request, explain_empty, marginal_values
from planner.frameworks import RULES, solver_for
from planner.milp import Mode, Objective, Solution, solve, solve_colocated
from planner.placement import reprice_sync, to_plan
from sim import SimResult, simulate
from traces import Cluster, CostModel, NodeGroup, Plan, SpecError, Workload, get_gpu
from traces.io import validate
from traces.progress import bar


@dataclass(frozen=True)
class Scored:
    """One placed plan with its analytic and simulated figures."""

    name: str
    plan: Plan
    solution: Solution
    simulated: SimResult | None

    @property
    def samples_per_s(self) -> float:
        return self.simulated.samples_per_s if self.simulated is not None else self.solution.samples_per_s

    def row(self) -> dict[str, Any]:
        return {"name": self.name, "samples_per_s": self.samples_per_s,
                "analytic_samples_per_s": self.solution.samples_per_s, "cost_per_hour": self.solution.cost_per_hour,
                "gpus": self.plan.gpus_by_type, "mode": self.plan.mode}


@dataclass(frozen=True)
class PlanReport:
    plan: Plan
    chosen: Scored
    ranked: tuple[Scored, ...]
    baselines: dict[str, Scored]
    marginal: dict[str, float]  # pool -> analytic samples/s per added GPU
    objective: Objective
    budget: float | None
    target: float | None
    seconds: dict[str, float] = field(default_factory=dict)
    # --framework: {"framework", "rule", "unrestricted_samples_per_s", "unrestricted_cost_per_hour"}
    restriction: dict[str, Any] | None = None

    def summary(self) -> dict[str, Any]:
        s = self.chosen.solution
        best_homog = self.baselines.get("homogeneous")
        return {
            "samples_per_s": self.chosen.samples_per_s,
            "analytic_samples_per_s": s.samples_per_s,
            "cost_per_hour": s.cost_per_hour,
            "cost_per_1k_samples": s.cost_per_hour / 3.6 / self.chosen.samples_per_s
            if self.chosen.samples_per_s > 0 else math.inf,
            "gpus": self.plan.gpus_by_type,
            "mode": self.plan.mode,
            "gap": s.gap,
            "lp_bound": s.lp_bound,
            "bottleneck": s.bottleneck,
            "marginal_samples_per_s_per_gpu": self.marginal,
            "baselines": {name: b.samples_per_s for name, b in self.baselines.items()},
            "baseline_plans": {name: b.row() for name, b in self.baselines.items()},
            "vs_best_homogeneous": self.chosen.samples_per_s / best_homog.samples_per_s
            if best_homog is not None and best_homog.samples_per_s > 0 else None,
            "ranked": [r.row() for r in self.ranked],
            "seconds": self.seconds,
            "restriction": self.restriction,
        }


def _score(name: str, cm: CostModel, cluster: Cluster, workload: Workload, cand: Candidates, sol: Solution,
           sim_steps: int, seed: int) -> Scored:
    plan = to_plan(cluster, workload, cand, sol)  # nodes only: repricing the sync does not move them
    sol = reprice_sync(cm, cluster, workload, cand, sol, plan)
    result = simulate(cluster, _for_mode(workload, sol.mode), plan, cm, steps=sim_steps, seed=seed,
                      record_queue=False) if sim_steps > 0 else None
    return Scored(name, plan, sol, result)


def _for_mode(workload: Workload, mode: Mode) -> Workload:
    if workload.mode == mode:
        return workload
    return workload.model_copy(update={"mode": mode, "staleness": workload.staleness if mode == "async" else 0})


def plan_report(
    cluster: Cluster, workload: Workload, *, objective: Objective = "throughput", budget: float | None = None,
    target: float | None = None, top_k: int = 3, cost_model: CostModel | None = None, solver: str = "auto",
    sim_steps: int = 8, seed: int = 0, baselines: bool = True, marginal: bool = True, refine: int = 3,
    framework: str | None = None,
) -> PlanReport:
    """Plan `workload` on `cluster`; see the module docstring. Raises SpecError (with the reason).

    `framework` ("areal", "verl") searches only plans it launches (planner.frameworks); the report's
    `restriction` then holds the unrestricted plan's figures, planned and simulated the same way."""
    cm = cost_model or CostModel()
    check_request(objective, budget, target, top_k, sim_steps)
    t0 = time.perf_counter()
    cand = candidates(cm, cluster, workload)
    mode: Mode = workload.mode
    solve_fn = solver_for(framework) if framework else solve
    found = solve_fn(cand, mode, objective, budget, target, top_k, solver)
    if not found:
        explain_empty(cm, cluster, workload, cand, mode, objective, budget, target, solver)
    t1 = time.perf_counter()
    with bar(len(found), "simulating the top plans", unit="plan") as progress:
        ranked = tuple(_tick(progress, _score(f"top-{i + 1}", cm, cluster, workload, cand, s, sim_steps, seed))
                       for i, s in enumerate(found))
    if sim_steps > 0 and refine > 0:
        ranked = _refine(cm, cluster, workload, cand, ranked, objective, budget, target, solver, sim_steps, seed,
                         refine, solve_fn)
    chosen = _pick(ranked, objective, target)
    t2 = time.perf_counter()
    spend = budget if budget is not None else chosen.solution.cost_per_hour
    base = _baselines(cm, cluster, workload, cand, chosen, spend, solver, sim_steps, seed) if baselines else {}
    t3 = time.perf_counter()
    values = marginal_values(cm, cluster, workload, mode, budget, solver) if marginal else {}
    t4 = time.perf_counter()
    seconds = {"solve": t1 - t0, "simulate": t2 - t1, "baselines": t3 - t2, "marginal": t4 - t3}
    predicted = {"samples_per_s": chosen.samples_per_s, "analytic_samples_per_s": chosen.solution.samples_per_s,
                 "cost_per_hour": chosen.solution.cost_per_hour, "gap": chosen.solution.gap,
                 **{f"baseline:{name}": b.samples_per_s for name, b in base.items()}}
    restriction = None
    if framework:
        free = plan_report(cluster, workload, objective=objective, budget=budget, target=target, top_k=top_k,
                           cost_model=cm, solver=solver, sim_steps=sim_steps, seed=seed, baselines=False,
                           marginal=False, refine=refine)
        restriction = {"framework": framework, "rule": RULES[framework],
                       "unrestricted_samples_per_s": free.chosen.samples_per_s,
                       "unrestricted_cost_per_hour": free.chosen.solution.cost_per_hour}
        predicted["unrestricted:samples_per_s"] = free.chosen.samples_per_s
    plan = chosen.plan.model_copy(update={"predicted": predicted})
    chosen = dataclasses.replace(chosen, plan=plan)
    return PlanReport(plan, chosen, ranked, base, values, objective, budget, target, seconds, restriction)


def plan(cluster: Cluster, workload: Workload, objective: Objective = "throughput", budget: float | None = None,
         top_k: int = 3, **kw: Any) -> Plan:
    """The best plan (its `predicted` holds analytic and simulated figures and the baselines')."""
    return plan_report(cluster, workload, objective=objective, budget=budget, top_k=top_k, **kw).plan


def _refine(cm: CostModel, cluster: Cluster, workload: Workload, cand: Candidates, ranked: tuple[Scored, ...],
            objective: Objective, budget: float | None, target: float | None, solver: str, sim_steps: int,
            seed: int, rounds: int, solve_fn: Any = solve) -> tuple[Scored, ...]:
    """Hill-climb on the trainer's size around the best simulated plan, one size step at a time.

    The analytic model sees training as a capacity; in simulation a faster trainer also publishes
    weights sooner, which widens the staleness window of the samples in flight. The simulator
    judges: each neighbour gets the MILP's best engines for it, and the climb stops when no
    neighbour simulates better (at most `rounds` moves).
    """
    out = list(ranked)
    seen = {(s.solution.trainer.pool, s.solution.trainer.nodes) for s in ranked}
    best = _pick(ranked, objective, target)
    for _ in range(rounds):
        t = best.solution.trainer
        moved = False
        sizes = sorted(o.nodes for o in cand.trainers if o.pool == t.pool)
        i = sizes.index(t.nodes)
        near = set(sizes[max(0, i - 1):i + 2]) - {t.nodes}  # the next smaller and larger sizes
        for option in cand.trainers:
            if option.pool != t.pool or option.nodes not in near or (option.pool, option.nodes) in seen:
                continue
            seen.add((option.pool, option.nodes))
            only = dataclasses.replace(cand, trainers=(option,))
            found = solve_fn(only, best.solution.mode, objective, budget, target, 1, solver)
            if not found:
                continue
            scored = _score(f"refined-{len(out) - len(ranked) + 1}", cm, cluster, workload, cand, found[0],
                            sim_steps, seed)
            out.append(scored)
            if _pick((best, scored), objective, target) is scored:
                best, moved = scored, True
        if not moved:
            break
    return tuple(out)


def _tick(progress: Any, value: Any) -> Any:
    progress.update()
    return value


def _pick(ranked: tuple[Scored, ...], objective: Objective, target: float | None) -> Scored:
    if objective == "throughput":
        return max(ranked, key=lambda s: (s.samples_per_s, -s.solution.cost_per_hour))
    meets = [s for s in ranked if target is None or s.samples_per_s >= target]
    if meets:
        return min(meets, key=lambda s: (s.solution.cost_per_hour, -s.samples_per_s))
    return max(ranked, key=lambda s: s.samples_per_s)


# ---- baselines ----------------------------------------------------------------------------------
def _baselines(cm: CostModel, cluster: Cluster, workload: Workload, cand: Candidates, chosen: Scored, budget: float,
               solver: str, sim_steps: int, seed: int) -> dict[str, Scored]:
    out: dict[str, Scored] = {}
    homog = _best_homogeneous(cm, cluster, workload, budget, solver, sim_steps, seed)
    if homog is not None:
        out["homogeneous"] = homog
    if chosen.solution.mode != "colocated":
        for share in (0.75, 0.5):
            split = _fixed_split(cm, cluster, workload, cand, chosen.solution, share, solver, sim_steps, seed)
            if split is not None:
                out[f"split-{round(share * 100)}/{round((1 - share) * 100)}"] = split
    colo_workload = _for_mode(workload, "colocated")
    colo_cand = candidates(cm, cluster, colo_workload)
    colo = solve_colocated(colo_cand, budget=budget)
    if colo:
        out["colocated-sync"] = _score("colocated-sync", cm, cluster, colo_workload, colo_cand, colo[0],
                                       sim_steps, seed)
    return out


def _best_homogeneous(cm: CostModel, cluster: Cluster, workload: Workload, budget: float, solver: str,
                      sim_steps: int, seed: int) -> Scored | None:
    """For each GPU type of the cluster: as many of its nodes as the budget buys (availability aside)."""
    best: Scored | None = None
    for group in cluster.node_groups:
        node_price = group.gpus_per_node * group.gpu.price_per_gpu_hour
        nodes = int(budget // node_price) if node_price > 0 else group.nodes
        if nodes < 1:
            continue
        only = Cluster(name=f"{group.gpu_type} x{nodes * group.gpus_per_node}",
                       node_groups=(group.model_copy(update={"nodes": nodes, "label": None}),))
        cand = candidates(cm, only, workload)
        found = solve(cand, workload.mode, "throughput", budget, None, 1, solver)
        if not found:
            continue
        scored = _score(f"homogeneous {group.gpu_type}", cm, only, workload, cand, found[0], sim_steps, seed)
        if best is None or scored.samples_per_s > best.samples_per_s:
            best = scored
    return best


def _fixed_split(cm: CostModel, cluster: Cluster, workload: Workload, cand: Candidates, sol: Solution,
                 rollout_share: float, solver: str, sim_steps: int, seed: int) -> Scored | None:
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
    found = solve(sub, sol.mode, "throughput", None, None, 1, solver)
    if not found:
        return None
    return _score(f"split {round(rollout_share * 100)}/{round((1 - rollout_share) * 100)}", cm, cluster, workload,
                  cand, found[0], sim_steps, seed)


# ---- sweeps -------------------------------------------------------------------------------------
def pareto(cluster: Cluster, workload: Workload, *, points: int = 8, cost_model: CostModel | None = None,
           solver: str = "auto") -> pd.DataFrame:
    """Min-cost plans for targets from 10% to 100% of the fleet's analytic maximum (no simulation)."""
    cm = cost_model or CostModel()
    if not 2 <= points <= 200:
        raise SpecError(f"points must be between 2 and 200, got {points}")
    cand = candidates(cm, cluster, workload)
    top = solve(cand, workload.mode, "throughput", None, None, 1, solver)
    if not top:
        explain_empty(cm, cluster, workload, cand, workload.mode, "throughput", None, None, solver)
    rows = []
    for frac in _tick_all(np.linspace(0.1, 1.0, points), "pareto sweep"):
        target = float(frac * top[0].samples_per_s) * (1 - 1e-6)
        found = solve(cand, workload.mode, "cost", None, target, 1, solver)
        if found:
            s = found[0]
            rows.append({"target": target, "samples_per_s": s.samples_per_s, "cost_per_hour": s.cost_per_hour,
                         "cost_per_1k_samples": s.cost_per_hour / 3.6 / s.samples_per_s, "gap": s.gap,
                         **_gpu_columns(to_plan(cluster, workload, cand, s))})
    return pd.DataFrame(rows)


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
            cost_model: CostModel | None = None, sim_steps: int = 8, seed: int = 0, solver: str = "auto",
            budget: float | None = None) -> pd.DataFrame:
    """One row per variant (the unchanged fleet first): plan it, simulate it, report it."""
    cm = cost_model or CostModel()
    variants = [Change("baseline")] + [c if isinstance(c, Change) else Change(**c) for c in changes]
    rows = []
    for change in _tick_all(variants, "what-if variants"):
        c2, w2 = apply_change(cluster, workload, change)
        spend = change.budget if change.budget is not None else budget
        try:
            r = plan_report(c2, w2, budget=spend, top_k=1, cost_model=cm, solver=solver, sim_steps=sim_steps,
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
        name = get_gpu(gpu_type).name
        mine = [i for i, g in enumerate(groups) if g.gpu_type == name]
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
    c2 = Cluster(name=f"{cluster.name}+{change.name}", node_groups=tuple(groups), links=cluster.links)
    w2 = workload
    if change.workload:
        data = {**workload.model_dump(), **change.workload}
        w2 = validate(Workload, data, f"what-if '{change.name}'")
    return c2, w2
