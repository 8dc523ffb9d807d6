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

from planner.candidates import Candidates, candidates
from planner.explain import check_request, explain_empty, marginal_values
from planner.frameworks import RULES, solver_for
from planner.milp import Mode, Objective, Solution, solve, solve_colocated
from planner.placement import reprice_sync, to_plan
from sim import SimResult, simulate
from traces import Cluster, CostModel, Plan, SpecError, Workload
from traces.plan_check import count_problems
from traces.progress import bar
from traces.records import recommended_steps


@dataclass(frozen=True)
class Scored:
    """One placed plan with its analytic and simulated figures."""

    name: str
    plan: Plan
    solution: Solution
    simulated: SimResult | None
    cand: Candidates = field(repr=False, compare=False)  # the options it was solved from (pool indices)

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
    cluster: Cluster | None = None  # what the plan was made for: which baselines it could run
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
            "baselines_within_fleet": {name: self.cluster is None or within(self.cluster, b.plan)
                                       for name, b in self.baselines.items()},
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
    return Scored(name, plan, sol, result, cand)


def _for_mode(workload: Workload, mode: Mode) -> Workload:
    if workload.mode == mode:
        return workload
    return workload.model_copy(update={"mode": mode, "staleness": workload.staleness if mode == "async" else 0})


def plan_report(
    cluster: Cluster, workload: Workload, *, objective: Objective = "throughput", budget: float | None = None,
    target: float | None = None, top_k: int = 3, cost_model: CostModel | None = None, solver: str = "auto",
    sim_steps: int | None = None, seed: int = 0, baselines: bool = True, marginal: bool = True, refine: int = 3,
    framework: str | None = None,
) -> PlanReport:
    """Plan `workload` on `cluster`; see the module docstring. Raises SpecError (with the reason).

    `sim_steps` None: enough trainer steps to measure one steady period (traces.records.recommended_steps).
    `framework` ("areal", "verl") searches only plans it launches (planner.frameworks); the report's
    `restriction` then holds the unrestricted plan's figures, planned and simulated the same way."""
    cm = cost_model or CostModel()
    if sim_steps is None:
        sim_steps = recommended_steps(workload.staleness if workload.mode == "async" else 0)
    check_request(objective, budget, target, top_k, sim_steps)
    t0 = time.perf_counter()
    cand = candidates(cm, cluster, workload)
    mode: Mode = workload.mode
    solve_fn = solver_for(framework) if framework else solve
    found = [(cand, s) for s in solve_fn(cand, mode, objective, budget, target, top_k, solver)]
    if not found:
        explain_empty(cm, cluster, workload, cand, mode, objective, budget, target, solver)
    found += _without_slow_links(cm, cluster, workload, mode, objective, budget, target, solver, solve_fn)
    t1 = time.perf_counter()
    with bar(len(found), "simulating the top plans", unit="plan") as progress:
        ranked = tuple(_tick(progress, _score(f"top-{i + 1}", cm, cluster, workload, c, s, sim_steps, seed))
                       for i, (c, s) in enumerate(found))
    if sim_steps > 0 and refine > 0:
        ranked = _refine(cm, cluster, workload, ranked, objective, budget, target, solver, sim_steps, seed, refine,
                         solve_fn)
    if objective == "cost" and target is not None and sim_steps > 0:
        ranked = _meet_target(cm, cluster, workload, ranked, budget, target, top_k, solver, sim_steps, seed)
    chosen = _pick(ranked, objective, target)
    t2 = time.perf_counter()
    spend = budget if budget is not None else chosen.solution.cost_per_hour
    base = _baselines(cm, cluster, workload, chosen, spend, solver, sim_steps, seed) if baselines else {}
    # A baseline that runs on this cluster in the asked mode is a plan too: never return a worse one
    # (under --framework only plans the framework launches are plans).
    rivals = [b for b in base.values() if b.plan.mode == chosen.plan.mode and within(cluster, b.plan)
              and not framework]
    chosen = _pick((chosen, *rivals), objective, target) if sim_steps > 0 else chosen
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
    return PlanReport(plan, chosen, ranked, base, values, objective, budget, target, seconds, cluster, restriction)


def plan(cluster: Cluster, workload: Workload, objective: Objective = "throughput", budget: float | None = None,
         top_k: int = 3, **kw: Any) -> Plan:
    """The best plan (its `predicted` holds analytic and simulated figures and the baselines')."""
    return plan_report(cluster, workload, objective=objective, budget=budget, top_k=top_k, **kw).plan


def _refine(cm: CostModel, cluster: Cluster, workload: Workload, ranked: tuple[Scored, ...],
            objective: Objective, budget: float | None, target: float | None, solver: str, sim_steps: int,
            seed: int, rounds: int, solve_fn: Any = solve) -> tuple[Scored, ...]:
    """Hill-climb on the trainer's size around the best simulated plan, one size step at a time.

    The analytic model sees training as a capacity; in simulation a faster trainer also publishes
    weights sooner, which widens the staleness window of the samples in flight. The simulator
    judges: each neighbour gets the MILP's best engines for it, and the climb stops when no
    neighbour simulates better (at most `rounds` moves).
    """
    out = list(ranked)
    seen = {(id(s.cand), s.solution.trainer.pool, s.solution.trainer.nodes) for s in ranked}
    best = _pick(ranked, objective, target)
    for _ in range(rounds):
        t, cand = best.solution.trainer, best.cand
        moved = False
        sizes = sorted(o.nodes for o in cand.trainers if o.pool == t.pool)
        i = sizes.index(t.nodes)
        near = set(sizes[max(0, i - 1):i + 2]) - {t.nodes}  # the next smaller and larger sizes
        for option in cand.trainers:
            if option.pool != t.pool or option.nodes not in near or (id(cand), option.pool, option.nodes) in seen:
                continue
            seen.add((id(cand), option.pool, option.nodes))
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


def _meet_target(cm: CostModel, cluster: Cluster, workload: Workload, ranked: tuple[Scored, ...],
                 budget: float | None, target: float, top_k: int, solver: str, sim_steps: int, seed: int,
                 rounds: int = 4) -> tuple[Scored, ...]:
    """Cost objective: re-solve with the analytic target raised by the simulated shortfall until a
    plan meets `target` in simulation; SpecError (one line, with the best found) if none does."""
    out, asked = list(ranked), target
    for _ in range(rounds):
        if any(s.samples_per_s >= target for s in out):
            return tuple(out)
        best = max(out, key=lambda s: s.samples_per_s / max(s.solution.samples_per_s, 1e-12))
        ratio = best.samples_per_s / best.solution.samples_per_s if best.solution.samples_per_s > 0 else 0.0
        asked = max(asked * 1.05, target / ratio if ratio > 0 else math.inf)
        if not math.isfinite(asked):
            break
        found = solve(best.cand, best.solution.mode, "cost", budget, asked, top_k, solver)
        if not found:
            break
        out.extend(_score(f"target-{len(out) + 1}", cm, cluster, workload, best.cand, s, sim_steps, seed)
                   for s in found)
    if any(s.samples_per_s >= target for s in out):
        return tuple(out)
    top = max(out, key=lambda s: s.samples_per_s)
    raise SpecError(f"no plan meets the target of {target:g} samples/s in simulation: the best found reaches "
                    f"{top.samples_per_s:.1f} at ${top.solution.cost_per_hour:,.2f}/h; lower --target, raise "
                    "--budget or add GPUs")


def within(cluster: Cluster, plan: Plan) -> bool:
    """Whether the cluster has the GPUs the plan uses (a budget-equal baseline may not)."""
    return not count_problems(cluster, plan)


def _without_slow_links(cm: CostModel, cluster: Cluster, workload: Workload, mode: Mode, objective: Objective,
                        budget: float | None, target: float | None, solver: str, solve_fn: Any = solve
                        ) -> list[tuple[Candidates, Solution]]:
    """The best plan that leaves out the nodes below each network speed, one per speed tier.

    Weight sync waits for the slowest link to any engine, so slow-linked nodes can cost more than
    they add; the MILP prices sync once for the whole fleet. Solving again without them makes the
    fleet's plan without its slow nodes always a candidate: more nodes never make the plan worse.
    """
    speeds = sorted({g.inter_node_gb_per_s * 1e9 for g in cluster.node_groups}, reverse=True)
    out = []
    for floor in speeds[:-1]:
        cand = candidates(cm, cluster, workload, min_link_bytes_per_s=floor)
        found = solve_fn(cand, mode, objective, budget, target, 1, solver) if cand.trainers else []
        out += [(cand, s) for s in found]
    return out


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
def _baselines(cm: CostModel, cluster: Cluster, workload: Workload, chosen: Scored, budget: float,
               solver: str, sim_steps: int, seed: int) -> dict[str, Scored]:
    out: dict[str, Scored] = {}
    homog = _best_homogeneous(cm, cluster, workload, budget, solver, sim_steps, seed)
    if homog is not None:
        out["homogeneous"] = homog
    if chosen.solution.mode != "colocated":
        for share in (0.75, 0.5):
            split = _fixed_split(cm, cluster, workload, chosen.cand, chosen.solution, share, solver, sim_steps,
                                 seed)
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
    kinds = {(cluster.group_gpu(g), g.gpus_per_node, g.inter_node_gb_per_s): g for g in reversed(cluster.node_groups)}
    for group in reversed(kinds.values()):  # one baseline per kind of node, first group of each kind
        node_price = group.gpus_per_node * cluster.group_gpu(group).price_per_gpu_hour
        nodes = int(budget // node_price) if node_price > 0 else group.nodes
        if nodes < 1:
            continue
        only = Cluster(name=f"{group.gpu_type} x{nodes * group.gpus_per_node}", gpus=cluster.gpus,
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
