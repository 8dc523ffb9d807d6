"""A request's search context, and plans judged by the simulator (`Scored`).

`Search` holds what every re-ranking step needs (fleet, job, objective, solver, simulation length,
the request's bounds) and a cache of simulated placements: many searches reach the same placed
plan (an engine-mix neighbour the MILP answers as before, a trainer size already tried), and a
seeded simulation of the same plan is the same result, so each placement is simulated once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from planner.bounds import Deadline
from planner.candidates import Candidates
from planner.milp import Mode, Objective, Solution, solve
from planner.placement import reprice_sync, to_plan
from sim import SimResult, simulate
from traces import Cluster, CostModel, Plan, SpecError, Workload

SolveFn = Callable[..., list[Solution]]  # planner.milp.solve's signature (or a framework's restriction of it)


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


def for_mode(workload: Workload, mode: Mode) -> Workload:
    """The workload run in `mode` (the colocated baseline runs an async job on-policy)."""
    if workload.mode == mode:
        return workload
    return workload.model_copy(update={"mode": mode, "staleness": workload.staleness if mode == "async" else 0})


@dataclass
class Search:
    """What a request's searches share (see the module docstring)."""

    cm: CostModel
    cluster: Cluster
    workload: Workload
    objective: Objective
    budget: float | None
    target: float | None
    solver: str
    sim_steps: int
    seed: int
    solve_fn: SolveFn = solve
    deadline: Deadline = field(default_factory=Deadline)
    framework: str | None = None  # --framework: searches keep to the plans it launches (planner.frameworks)
    _seen: dict[str, Scored] = field(default_factory=dict, repr=False)

    def solve(self, cand: Candidates, mode: Mode, top_k: int = 1, *, objective: Objective | None = None,
              restricted: bool = True, **override: float | None) -> list[Solution]:
        """The request's MILP under its bounds: its objective, budget and target unless `objective`,
        `budget=` or `target=` say otherwise (None: no budget, no target); `restricted=False`
        ignores a --framework restriction (the baselines are free plans)."""
        budget = override.get("budget", self.budget)
        target = override.get("target", self.target)
        fn = self.solve_fn if restricted else solve
        return fn(cand, mode, objective or self.objective, budget, target, top_k, self.solver, deadline=self.deadline)

    def score(self, name: str, cand: Candidates, sol: Solution, *, cluster: Cluster | None = None,
              workload: Workload | None = None, where: str = "re-ranking", counted: bool = True) -> Scored | None:
        """Place, reprice and simulate one solution; None once the request's bounds stop simulating
        (`counted=False`: the clock only, for the few baselines every report carries)."""
        cluster, workload = cluster or self.cluster, workload or self.workload
        plan = to_plan(cluster, workload, cand, sol)  # nodes only: repricing the sync does not move them
        sol = reprice_sync(self.cm, cluster, workload, cand, sol, plan)
        if self.sim_steps <= 0:
            return Scored(name, plan, sol, None, cand)
        key = f"{cluster.model_dump_json()}|{for_mode(workload, sol.mode).model_dump_json()}|{plan.model_dump_json()}"
        if key in self._seen:
            old = self._seen[key]
            return Scored(name, plan, sol, old.simulated, cand)
        if not (self.deadline.may_simulate(where) if counted else not self.deadline.expired(where)):
            return None
        self.deadline.simulated += counted
        try:
            result = simulate(cluster, for_mode(workload, sol.mode), plan, self.cm, steps=self.sim_steps,
                              seed=self.seed, record_queue=False, wall_seconds=max(self.deadline.left(), 1.0))
        except SpecError:
            if self.deadline.expired(where):  # cut short by the request's clock, not by the plan
                return None
            raise
        scored = Scored(name, plan, sol, result, cand)
        self._seen[key] = scored
        return scored

    def pick(self, ranked: tuple[Scored, ...] | list[Scored]) -> Scored:
        """The request's best: most samples/s, or the cheapest meeting the target (else the fastest)."""
        if self.objective == "throughput":
            return max(ranked, key=lambda s: (s.samples_per_s, -s.solution.cost_per_hour))
        meets = [s for s in ranked if self.target is None or s.samples_per_s >= self.target]
        if meets:
            return min(meets, key=lambda s: (s.solution.cost_per_hour, -s.samples_per_s))
        return max(ranked, key=lambda s: s.samples_per_s)
