"""`planner.plan`: candidates -> MILP -> placement -> simulator re-rank, with baselines and reasons.

The MILP ranks allocations by an analytic model (planner.milp); the best K distinct ones are placed
and simulated, the searches of planner.rerank move around the best (network tiers, the trainer's
size, the engine mix), and the best simulated one wins. Baselines (planner.baselines) are planned
and simulated the same way at the same budget, so the comparison is like for like. One request
runs under the bounds of planner.bounds; a bound that stops a search is named in `notes`.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Any

from planner.baselines import baselines as plan_baselines
from planner.bounds import MAX_SIMULATIONS, PLAN_SECONDS, Deadline
from planner.confirm import best_confirmed, confirm, unsettled_note
from planner.explain import check_request, explain_empty
from planner.frameworks import RULES, solver_for
from planner.marginal import ask_ahead, marginal_values
from planner.milp import Mode, Objective, raced, solve
from planner.parallel import Simulations
from planner.rerank import climb, meet_target, without_slow_links
from planner.scoring import Scored, Search, Trial
from traces import Cluster, CostModel, Plan, Workload
from traces.plan_check import count_problems
from traces.progress import bar
from traces.records import recommended_steps

__all__ = ["PlanReport", "Scored", "plan", "plan_report", "within"]


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
    notes: tuple[str, ...] = ()  # a bound that stopped a search (planner.bounds), one line each

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
            "notes": list(self.notes),
        }


def plan_report(
    cluster: Cluster, workload: Workload, *, objective: Objective = "throughput", budget: float | None = None,
    target: float | None = None, top_k: int = 3, cost_model: CostModel | None = None, solver: str = "auto",
    sim_steps: int | None = None, seed: int = 0, baselines: bool = True, marginal: bool = True, refine: int = 3,
    explore: int = 2, framework: str | None = None, max_seconds: float = PLAN_SECONDS,
    max_simulations: int = MAX_SIMULATIONS, workers: int | None = None, settle: bool = True,
) -> PlanReport:
    """Plan `workload` on `cluster`; see the module docstring. Raises SpecError (with the reason).

    `sim_steps` None: enough trainer steps to measure one steady period (traces.records.recommended_steps).
    `refine` / `explore`: moves of the trainer-size and engine-mix hill-climbs (0: none).
    `framework` ("areal", "verl") searches only plans it launches (planner.frameworks); the report's
    `restriction` then holds the unrestricted plan's figures, planned and simulated the same way.
    `max_seconds` / `max_simulations`: the request's bounds (planner.bounds).
    `settle`: the plans that can still win, and the baselines, are scored by settling runs
    (planner.confirm); False: by the screening window alone (faster; it can overstate a plan).
    `workers`: processes simulating independent plans side by side (planner.parallel; None: one per
    core, 1: all in this process); the report is the same whatever the count."""
    cm = cost_model or CostModel()
    if sim_steps is None:
        sim_steps = recommended_steps(workload.staleness if workload.mode == "async" else 0)
    check_request(objective, budget, target, top_k, sim_steps)
    deadline = Deadline(seconds=max_seconds, simulations=max_simulations)
    search = Search(cm, cluster, workload, objective, budget, target, solver, sim_steps, seed,
                    solver_for(framework) if framework else solve, deadline, framework=framework,
                    sims=Simulations(workers), settle=settle)
    try:
        t0 = time.perf_counter()
        cand = search.candidates()  # the cost tables loaded before the workers fork: they inherit them
        mode: Mode = workload.mode
        if sim_steps > 0 or marginal:  # workers for simulations and independent MILPs (not for the MILP alone)
            search.sims.start(cm, warm=sim_steps > 0)
        found = [(cand, s) for s in search.solve(cand, mode, top_k)]
        whole = deadline.hit is None  # the request's MILP ran to the end: its answer is the marginal values' base
        # the request's own MILP answered the marginal values' base question unless it asked another;
        # its rate is where the kinds' fixed points start (planner.marginal)
        same = objective == "throughput" and target is None and not framework and whole and bool(found)
        start = found[0][1].samples_per_s if same else None
        if not found:
            if deadline.hit:
                raise deadline.nothing_found()
            explain_empty(cm, cluster, workload, cand, mode, objective, budget, target, solver)
        ahead = ask_ahead(search, mode, budget, start) if marginal else None  # beside the search
        found += without_slow_links(search, top_k)
        t1 = time.perf_counter()
        with bar(len(found), "simulating the top plans", unit="plan") as progress:
            scored = search.score_many([Trial(f"top-{i + 1}", c, s) for i, (c, s) in enumerate(found)])
            progress.update(len(found))
        ranked = tuple(s for s in scored if s is not None)
        if not ranked:
            raise deadline.nothing_found()
        if sim_steps > 0:
            ranked = climb(search, ranked, refine, explore)
        if objective == "cost" and target is not None and sim_steps > 0:
            ranked = meet_target(search, ranked, top_k)
        ranked = confirm(search, ranked)
        chosen = best_confirmed(search, ranked)
        t2 = time.perf_counter()
        spend = budget if budget is not None else chosen.solution.cost_per_hour
        base = plan_baselines(search, chosen, spend) if baselines else {}
        base = dict(zip(base, search.settle_many(list(base.values()), where="the baselines' settling runs",
                                                 counted=False), strict=True))  # like for like: settled as the plan is
        # A baseline that runs on this cluster in the asked mode is a plan too: never return a worse one
        # (under --framework only plans the framework launches are plans).
        rivals = [b for b in base.values() if b.plan.mode == chosen.plan.mode and within(cluster, b.plan)
                  and not framework]
        chosen = best_confirmed(search, (chosen, *rivals)) if sim_steps > 0 else chosen
        # the answer's analytic figure: non-interruptible engines priced by their race for each version's
        # samples (planner.tail_model.race; too slow to price every candidate, so the MILP ranks on its slopes)
        chosen = dataclasses.replace(chosen, solution=raced(chosen.cand, chosen.solution))
        t3 = time.perf_counter()
        values = marginal_values(search, mode, budget, start, ahead) if marginal else {}
        t4 = time.perf_counter()
        seconds = {"solve": t1 - t0, "simulate": t2 - t1, "baselines": t3 - t2, "marginal": t4 - t3}
        predicted = {"samples_per_s": chosen.samples_per_s, "analytic_samples_per_s": chosen.solution.samples_per_s,
                     **_window(chosen),
                     "cost_per_hour": chosen.solution.cost_per_hour, "gap": chosen.solution.gap,
                     **{f"baseline:{name}": b.samples_per_s for name, b in base.items()}}
        restriction = None
        if framework:
            free = plan_report(cluster, workload, objective=objective, budget=budget, target=target, top_k=top_k,
                               cost_model=cm, solver=solver, sim_steps=sim_steps, seed=seed, baselines=False,
                               marginal=False, refine=refine, explore=explore, max_seconds=max(deadline.left(), 1.0),
                               max_simulations=max_simulations, workers=workers, settle=settle)
            restriction = {"framework": framework, "rule": RULES[framework],
                           "unrestricted_samples_per_s": free.chosen.samples_per_s,
                           "unrestricted_cost_per_hour": free.chosen.solution.cost_per_hour}
            predicted["unrestricted:samples_per_s"] = free.chosen.samples_per_s
        plan = chosen.plan.model_copy(update={"predicted": predicted})
        chosen = dataclasses.replace(chosen, plan=plan)
        notes = tuple(n for n in (deadline.hit, unsettled_note(search, ranked, chosen)) if n)
        return PlanReport(plan, chosen, ranked, base, values, objective, budget, target, seconds, cluster, restriction,
                          notes)
    finally:
        search.sims.close()


def plan(cluster: Cluster, workload: Workload, objective: Objective = "throughput", budget: float | None = None,
         top_k: int = 3, **kw: Any) -> Plan:
    """The best plan (its `predicted` holds analytic and simulated figures and the baselines')."""
    return plan_report(cluster, workload, objective=objective, budget=budget, top_k=top_k, **kw).plan


def _window(chosen: Scored) -> dict[str, float]:
    """The simulated figure's window: steps simulated, and 1.0 / 0.0 whether a settling run settled."""
    sim = chosen.simulated
    if sim is None:
        return {}
    return {"sim_steps": float(len(sim.step_times))} | ({} if sim.settled is None else {"settled": float(sim.settled)})


def within(cluster: Cluster, plan: Plan) -> bool:
    """Whether the cluster has the GPUs the plan uses (a budget-equal baseline may not)."""
    return not count_problems(cluster, plan)
