"""A request's search context, and plans judged by the simulator (`Scored`).

`Search` holds what every re-ranking step needs (fleet, job, objective, solver, simulation length,
the request's bounds) and what a request computes once (issue 19): the candidates of each fleet
(the plan's, its network tiers', its baselines', its marginal values'), each MILP's answer, and
each placement's simulation. Many searches reach the same placed plan (an engine-mix neighbour
the MILP answers as before, a trainer size already tried, a baseline that is a candidate), and a
seeded simulation of the same plan is the same result, so each placement (keyed by its fleet,
job and plan, the seed being the request's) is simulated once. Independent solves and independent
simulations run in the request's worker processes (`solve_many`, `score_many`; planner.parallel).
Each screening simulation is kept with its result (`Scored.job`), so the few plans that can still
win are simulated again as settling runs (`settle_many`, planner.confirm), once per placement.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from planner.bounds import Deadline
from planner.candidates import Candidates, candidates
from planner.milp import Mode, Objective, Solution, solve
from planner.parallel import SimJob, Simulations, SolveJob, solve_job
from planner.placement import reprice_sync, to_plan
from sim import SimResult
from traces import Cluster, CostModel, Plan, SpecError, Workload
from traces.records import settle_cap

SolveFn = Callable[..., list[Solution]]  # planner.milp.solve's signature (or a framework's restriction of it)


@dataclass(frozen=True)
class Scored:
    """One placed plan with its analytic and simulated figures."""

    name: str
    plan: Plan
    solution: Solution
    simulated: SimResult | None
    cand: Candidates = field(repr=False, compare=False)  # the options it was solved from (pool indices)
    job: SimJob | None = field(default=None, repr=False, compare=False)  # the screening simulation
    screened: SimResult | None = field(default=None, repr=False, compare=False)  # before a settling run replaced it

    @property
    def samples_per_s(self) -> float:
        return self.simulated.samples_per_s if self.simulated is not None else self.solution.samples_per_s

    @property
    def confirmed(self) -> bool:
        """Whether its figure is a settling run's (Search.settle_many), not the screening window's."""
        return self.simulated is not None and self.simulated.settled is not None

    def row(self) -> dict[str, Any]:
        sim = self.simulated
        return {"name": self.name, "samples_per_s": self.samples_per_s,
                "analytic_samples_per_s": self.solution.samples_per_s, "cost_per_hour": self.solution.cost_per_hour,
                "gpus": self.plan.gpus_by_type, "mode": self.plan.mode,
                "sim_steps": len(sim.step_times) if sim is not None else 0, "settled": sim.settled if sim else None,
                "screened_samples_per_s": self.screened.samples_per_s if self.screened is not None else None}


@dataclass(frozen=True)
class Trial:
    """One solution to place and simulate (`cluster`, `workload`: None for the request's)."""

    name: str
    cand: Candidates
    sol: Solution
    cluster: Cluster | None = None
    workload: Workload | None = None


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
    sims: Simulations = field(default_factory=lambda: Simulations(1), repr=False)
    settle: bool = True  # confirm the plans a request reports with settling runs (planner.confirm)
    _seen: dict[str, Scored] = field(default_factory=dict, repr=False)
    _settled: dict[str, SimResult] = field(default_factory=dict, repr=False)
    _options: dict[str, Candidates] = field(default_factory=dict, repr=False)
    _solved: dict[tuple[object, ...], list[Solution]] = field(default_factory=dict, repr=False)

    def solve(self, cand: Candidates, mode: Mode, top_k: int = 1, *, objective: Objective | None = None,
              restricted: bool = True, bounded: bool = True, start_rate: float | None = None,
              **override: float | None) -> list[Solution]:
        """The request's MILP under its bounds: its objective, budget and target unless `objective`,
        `budget=` or `target=` say otherwise (None: no budget, no target); `restricted=False`
        ignores a --framework restriction (the baselines are free plans); `bounded=False` solves
        to the end whatever the request's clock (a figure that must not be cut short); `start_rate`:
        where the async fixed point starts (planner.milp.solve_async)."""
        key, job = self._question(cand, mode, top_k, objective=objective, restricted=restricted, bounded=bounded,
                                  start_rate=start_rate, **override)
        if key in self._solved:  # the same MILP again (a search's neighbour, a baseline): one answer
            return list(self._solved[key])
        fn = self.solve_fn if restricted else solve
        found = fn(cand, mode, job.objective, job.budget, job.target, top_k, self.solver, deadline=job.deadline,
                   start_rate=start_rate)
        return self._keep(key, found, bounded)

    def _question(self, cand: Candidates, mode: Mode, top_k: int, *, objective: Objective | None = None,
                  restricted: bool = True, bounded: bool = True, start_rate: float | None = None,
                  **override: float | None) -> tuple[tuple[object, ...], SolveJob]:
        """`solve`'s cache key and the MILP it asks (as a SolveJob a worker can run)."""
        budget = override.get("budget", self.budget)
        target = override.get("target", self.target)
        fn = self.solve_fn if restricted else solve
        key = (cand, mode, objective or self.objective, budget, target, top_k, fn, start_rate)
        return key, SolveJob(cand, mode, objective or self.objective, budget, target, top_k, self.solver,
                             self.deadline if bounded else None, self.framework if restricted else None,
                             start_rate=start_rate)

    def _keep(self, key: tuple[object, ...], found: list[Solution], bounded: bool) -> list[Solution]:
        if not bounded or self.deadline.hit is None:  # an answer cut short by the bounds is not the MILP's
            self._solved[key] = list(found)
        return found

    def solve_many(self, jobs: list[tuple[Candidates, Mode, int, dict[str, Any]]]) -> list[list[Solution]]:
        """`solve(cand, mode, top_k, **kw)` for independent jobs, in the request's worker processes
        when it has workers (each answer is the serial one: a MILP's answer does not depend on what
        else runs; the bounds a worker's solve hit are noted here in submission order, as one at a
        time notes them)."""
        if self.sims.workers == 1 or len(jobs) < 2:
            return [self.solve(c, m, k, **kw) for c, m, k, kw in jobs]
        if not self._portable():  # a solver a worker cannot rebuild: threads (HiGHS runs outside the GIL)
            with ThreadPoolExecutor(self.sims.workers) as pool:
                return list(pool.map(lambda job: self.solve(job[0], job[1], job[2], **job[3]), jobs))
        asked = [self._question(c, m, k, **kw) for c, m, k, kw in jobs]
        futures = {key: self.sims.submit(solve_job, job) for key, job in dict(asked).items()
                   if key not in self._solved}
        answers: dict[tuple[object, ...], list[Solution]] = {}
        out = []
        for (key, _), (_, _, _, kw) in zip(asked, jobs, strict=True):
            if key in futures and key not in answers:  # in order, as one at a time
                found, hit = futures[key].result()
                if hit is not None and self.deadline.hit is None:
                    self.deadline.hit = hit
                answers[key] = self._keep(key, found, kw.get("bounded", True))
            out.append(list(answers[key] if key in answers else self._solved[key]))
        return out

    def _portable(self) -> bool:
        """Whether a worker can run this request's MILPs: planner.milp.solve, or a framework's restriction."""
        return self.solve_fn is solve or self.framework is not None

    def candidates(self, cluster: Cluster | None = None, workload: Workload | None = None,
                   **kw: float | None) -> Candidates:
        """planner.candidates.candidates for this request's cost model, computed once per (fleet, job,
        options): the plan, its network tiers, its baselines and its marginal values share them."""
        cluster, workload = cluster or self.cluster, workload or self.workload
        key = f"{cluster.model_dump_json()}|{workload.model_dump_json()}|{sorted(kw.items())}"
        if key not in self._options:
            self._options[key] = candidates(self.cm, cluster, workload, **kw)  # type: ignore[arg-type]
        return self._options[key]

    def score(self, name: str, cand: Candidates, sol: Solution, *, cluster: Cluster | None = None,
              workload: Workload | None = None, where: str = "re-ranking", counted: bool = True) -> Scored | None:
        """Place, reprice and simulate one solution; None once the request's bounds stop simulating
        (`counted=False`: the clock only, for the few baselines every report carries)."""
        return self.score_many([Trial(name, cand, sol, cluster, workload)], where=where, counted=counted)[0]

    def score_many(self, trials: list[Trial], *, where: str = "re-ranking", counted: bool = True
                   ) -> list[Scored | None]:
        """`score` for independent trials, their simulations side by side (planner.parallel), each
        answer what `score` one at a time gives: the bounds are checked in order before any runs."""
        out: list[Scored | None] = [None] * len(trials)
        todo: dict[str, tuple[SimJob, list[tuple[int, Trial, Plan, Solution]]]] = {}
        for i, t in enumerate(trials):
            cluster, workload = t.cluster or self.cluster, t.workload or self.workload
            plan = to_plan(cluster, workload, t.cand, t.sol)  # nodes only: repricing the sync does not move them
            sol = reprice_sync(self.cm, cluster, workload, t.cand, t.sol, plan)
            if self.sim_steps <= 0:
                out[i] = Scored(t.name, plan, sol, None, t.cand)
                continue
            job = SimJob(cluster, for_mode(workload, sol.mode), plan, self.cm, self.sim_steps, self.seed, 0.0)
            key = job.key()
            if key in self._seen:
                out[i] = Scored(t.name, plan, sol, self._seen[key].simulated, t.cand, self._seen[key].job)
                continue
            if key in todo:  # the same placement twice in one batch: simulated once
                todo[key][1].append((i, t, plan, sol))
                continue
            if not (self.deadline.may_simulate(where) if counted else not self.deadline.expired(where)):
                break  # as one at a time: nothing after the first refusal is simulated
            self.deadline.simulated += counted
            todo[key] = (dataclasses.replace(job, wall_seconds=max(self.deadline.left(), 1.0)), [(i, t, plan, sol)])
        results = self.sims.run([job for job, _ in todo.values()])
        for (key, (job, uses)), result in zip(todo.items(), results, strict=True):
            if not self._finished(result, where):
                continue
            for i, t, plan, sol in uses:
                out[i] = Scored(t.name, plan, sol, result, t.cand, job)
            self._seen[key] = out[uses[0][0]]  # type: ignore[assignment]
        return out

    def settle_many(self, scored: list[Scored], *, where: str, counted: bool = True) -> list[Scored]:
        """Each simulated plan again, as a settling run (sim.simulate's until_settled: the rate
        after the warm-up measured until it stops moving, capped at traces.records.settle_cap),
        side by side; each placement once per request. A settling run counts against the
        request's simulations as a screening run does (`counted=False`: the clock only, as for
        the baselines' screening). A plan the request's bounds stop keeps its screening figure
        (and the report's notes say which bound stopped where)."""
        out = list(scored)
        todo: dict[str, tuple[SimJob, list[int]]] = {}
        for i, s in enumerate(scored):
            if s.job is None or s.confirmed or not self.settle:
                continue
            key = s.job.key()
            if key in self._settled:
                out[i] = dataclasses.replace(s, simulated=self._settled[key], screened=s.simulated)
            elif key in todo:
                todo[key][1].append(i)
            elif (self.deadline.may_simulate(where, settling=True) if counted
                  else not self.deadline.expired(where)):
                self.deadline.simulated += counted
                run = s.job.workload
                cap = settle_cap(run.staleness if run.mode == "async" else 0)
                todo[key] = (dataclasses.replace(s.job, steps=cap, until_settled=True,
                                                 wall_seconds=max(self.deadline.left(), 1.0)), [i])
        results = self.sims.run([job for job, _ in todo.values()])
        for (key, (_, uses)), result in zip(todo.items(), results, strict=True):
            if not self._finished(result, where):
                continue
            self._settled[key] = result
            for i in uses:
                out[i] = dataclasses.replace(scored[i], simulated=result, screened=scored[i].simulated)
        return out

    def _finished(self, result: SimResult | SpecError, where: str) -> bool:
        """Whether a simulation ran to its end: False when the request's clock cut it short; the
        plan's own SpecError is raised."""
        if not isinstance(result, SpecError):
            return True
        if self.deadline.expired(where):
            return False
        raise result

    def pick(self, ranked: tuple[Scored, ...] | list[Scored]) -> Scored:
        """The request's best: most samples/s, or the cheapest meeting the target (else the fastest)."""
        return min(ranked, key=self.preference)

    def preference(self, s: Scored) -> tuple[float, ...]:
        """`pick`'s order as a sort key (the plan pick takes sorts first; the first of equals)."""
        if self.objective == "throughput":
            return (-s.samples_per_s, s.solution.cost_per_hour)
        if self.target is None or s.samples_per_s >= self.target:
            return (0.0, s.solution.cost_per_hour, -s.samples_per_s)
        return (1.0, -s.samples_per_s, 0.0)
