"""The allocation MILP (PuLP; HiGHS through highspy, CBC as the fallback).

Variables: x_r >= 0 integer rollout engines of option r; n_rj >= 0 in-flight samples on segment j
of option r's rate curve; y_k binary trainer option k; z >= 0 throughput (samples/s).
Asynchronous plans (generation and training overlap):

    max z  s.t.  z <= sum_rj slope_rj n_rj          generation: concave piecewise rate per engine
                 n_rj <= width_rj x_r               (engines equally loaded: the router water-fills)
                 sum_rj n_rj <= (eta + 1) B          samples in flight under the capacity rule, and
                 sum_rj n_rj + r sum_k T_k w_k <= r (eta + 1) B   the long tail (Little's law), w_k = z y_k
                 (sum_k w_k = z, w_k <= s_k y_k)    (Candidates.in_flight_cap, r = E[o]/E[max o])
                 z <= sum_k s_k y_k,  sum_k y_k = 1 training
                 per pool p: sum_{r in p} tp_r x_r + sum_{k in p} gpus_k y_k <= gpus_p
                 sum_r c_r x_r + sum_k c_k y_k <= budget           (optional, $/h)

The cost objective minimises the $/h term subject to z >= target. The LP relaxation (x, y
continuous) bounds the optimum; every solution reports the solver's proven optimality gap. A
throughput MILP of many trainer options is solved without those whose bound (planner.trainer_bounds)
is below a feasible plan's objective, which answers the same with a smaller root.
Interruptible rollouts lose each step's weight wait and KV re-prefill, a share of the step period
B / z; the others drain their batch before each update (planner.tail_model): the slopes are derated
for the period of the previous solve until z settles (a fixed point, planner.fixed_point: at most
FIXED_POINT_ROUNDS solves; under a target, at the target's period B / target), and each answer's rate
is then the one at its own period (`settled`), so a plan that meets a target meets it at the period
it runs at.

On-policy plans alternate, so the step is a sum, B / G + T_k (or the longest sample, if longer),
which is not linear. For a fixed trainer and a fixed slowest allowed engine type it grows with G, so
they are solved exactly by enumerating both and maximising G in the MILP above (in flight: one
batch; each engine's curve its drain rate, planner.drain.drain_rates: a one-shot batch thins
out as its samples finish). Colocated plans share one pool's GPUs and are enumerated outright.
The rate model itself (`evaluate`, and `raced`, which prices the answer by the simulator's routing
and update rules) is planner.rate_model.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pulp

from planner.bounds import Deadline
from planner.candidates import Candidates, EngineOption
from planner.fixed_point import FIXED_POINT_ROUNDS as FIXED_POINT_ROUNDS  # re-exported, as settled
from planner.fixed_point import derated_at, settles
from planner.fixed_point import settled as settled
from planner.rate_model import Mode, Solution, priced
from planner.rate_model import evaluate as evaluate  # re-exported: the rate model (planner.rerank, placement)
from planner.rate_model import raced as raced  # re-exported: the answer's priced figure (planner.api)
from planner.solver import SOLVE_SECONDS, proven_gap, solved
from planner.trainer_bounds import TIE_BREAK, objective_bounds

Objective = Literal["throughput", "cost"]
PRUNE_FROM = 32  # trainer options from which a throughput MILP leaves out those out of reach (_Ranking)
PROBES = 3  # options of the highest bounds solved alone for the floor (each a MILP of one trainer)


# ---- asynchronous: one MILP ------------------------------------------------------------------
@dataclass
class _Model:
    prob: pulp.LpProblem
    x: dict[int, pulp.LpVariable]
    y: dict[int, pulp.LpVariable]
    z: pulp.LpVariable
    n: dict[tuple[int, int], pulp.LpVariable]  # (option, segment) -> in-flight samples on it
    deadline: Deadline | None = None  # the request's clock: no solve runs past it


def _build(cand: Candidates, objective: Objective, budget: float | None, target: float | None,
           trainers: list[int], engines: list[int], relax: bool, in_flight: float, training: bool = True,
           tail: bool = False) -> _Model:
    prob = pulp.LpProblem("rlfleet", pulp.LpMaximize if objective == "throughput" else pulp.LpMinimize)
    integer = pulp.LpContinuous if relax else pulp.LpInteger
    binary = pulp.LpContinuous if relax else pulp.LpBinary
    pools = {p.index: p for p in cand.pools}
    opts = {r: cand.engines[r] for r in engines}
    ub = {r: pools[o.pool].gpus // o.tp for r, o in opts.items()}
    x = {r: prob.add_variable(f"x{r}", 0, ub[r], integer) for r in opts}
    y = {k: prob.add_variable(f"y{k}", 0, 1, binary) for k in trainers}
    z = prob.add_variable("z", 0)
    cost = pulp.lpSum(o.price_per_hour * x[r] for r, o in opts.items()) + pulp.lpSum(
        cand.trainers[k].price_per_hour * y[k] for k in trainers)
    # among plans of equal throughput prefer the cheaper one (a tie-break too small to trade throughput)
    prob += z - TIE_BREAK * cost if objective == "throughput" else cost
    flow: dict[tuple[int, int], pulp.LpVariable] = {}
    for r, o in opts.items():
        for j, (width, _) in enumerate(o.segments):
            flow[r, j] = n = prob.add_variable(f"n{r}_{j}", 0)
            prob += n <= width * x[r], f"seg{r}_{j}"
    prob += _generation(cand, z, flow), "generation"
    held = pulp.lpSum(flow.values())
    prob += held <= in_flight, "in_flight"
    if tail:  # Candidates.in_flight_cap: held + r T_k z <= r (eta + 1) B for the chosen trainer k, with
        # w_k = z y_k exactly (sum w_k = z, w_k <= s_k y_k: one y_k is 1), tighter than a big-M row per trainer
        w = {k: prob.add_variable(f"w{k}", 0, cand.trainers[k].samples_per_s) for k in trainers}
        for k in trainers:
            prob += w[k] <= cand.trainers[k].samples_per_s * y[k], f"w{k}_on"
        prob += pulp.lpSum(w.values()) == z, "w_sum"
        r = cand.tail_ratio
        prob += held + r * pulp.lpSum(cand.trainers[k].step_seconds * w[k] for k in trainers) \
            <= r * cand.admitted_cap, "tail"
    if training:  # on-policy plans price training outside the MILP
        prob += z <= pulp.lpSum(cand.trainers[k].samples_per_s * y[k] for k in trainers), "training"
    prob += pulp.lpSum(y.values()) == 1, "one_trainer"
    for p in cand.pools:
        used = pulp.lpSum(o.tp * x[r] for r, o in opts.items() if o.pool == p.index) + pulp.lpSum(
            cand.trainers[k].nodes * p.per_node * y[k] for k in trainers if cand.trainers[k].pool == p.index)
        prob += used <= p.gpus, f"gpus_pool{p.index}"
    if budget is not None:
        prob += cost <= budget, "budget"
    if target is not None:
        prob += z >= target, "target"
    return _Model(prob, x, y, z, flow)


def _generation(cand: Candidates, z: pulp.LpVariable, flow: dict[tuple[int, int], pulp.LpVariable]
                ) -> pulp.LpConstraint:
    """z <= sum_rj slope_rj n_rj: the only row the update derating (EngineOption.derated) changes."""
    return z <= pulp.lpSum(cand.engines[r].segments[j][1] * n for (r, j), n in flow.items())


def _reslope(model: _Model, cand: Candidates) -> None:
    """`model` as _build makes it for `cand`, whose options differ from the model's only in their
    slopes (another period's derating): the generation row rebuilt in its place, the rest kept."""
    row = _generation(cand, model.z, model.n)
    row.name = "generation"
    model.prob._constraints["generation"] = row  # same key: the row keeps its position (PuLP has no replace)


def _solve(model: _Model, solver_name: str, relax: bool) -> bool:
    seconds = model.deadline.left() if model.deadline is not None else SOLVE_SECONDS
    return solved(model.prob, solver_name, relax, seconds) and model.z.varValue is not None


def _chosen(cand: Candidates, model: _Model) -> tuple[int, tuple[tuple[EngineOption, int], ...]]:
    k = next(k for k, v in model.y.items() if (v.varValue or 0) > 0.5)
    engines = tuple((cand.engines[r], round(v.varValue or 0)) for r, v in model.x.items() if round(v.varValue or 0))
    return k, engines


def solve_async(cand: Candidates, objective: Objective = "throughput", *, budget: float | None = None,
                target: float | None = None, top_k: int = 1, solver_name: str = "auto",
                deadline: Deadline | None = None, start_rate: float | None = None) -> list[Solution]:
    """solve_async_fixed with the update derating (interruptible pause, or drain) at its fixed point.

    `start_rate`: a rate near the answer's (a neighbouring fleet's), where the fixed point starts: a
    round whose rate is within 1% of it ends the search (issue 19: one MILP round per marginal value or
    climb step instead of three). Without one, a throughput search starts at the fixed point of the LP
    relaxation (_relaxed_fixed_point: LP rounds where each MILP round costs its root's cuts), and its
    MILP rounds mostly settle in one. Same answers on the shipped examples and 10 random fleets
    (bench/same_plans.py)."""
    kw = {"budget": budget, "target": target, "solver_name": solver_name, "deadline": deadline}
    if not any(o.update_seconds for o in cand.engines):
        return solve_async_fixed(cand, objective, top_k=top_k, **kw)  # type: ignore[arg-type]
    last_round: tuple[Candidates, _Ranking] | None = None  # when the rate settled: that round's MILP
    ranking: _Ranking | None = None  # one MILP for every round: each round changes its slopes only
    if target is not None:
        # a cost objective buys the least that meets the target: such a plan runs at its period B / target
        period = cand.samples_per_step / target
    else:
        period, last = math.inf, 0.0
        if start_rate is None and objective == "throughput":  # none given: the LP relaxation's fixed point
            ranking = _Ranking(cand, objective, budget, target, solver_name, deadline)  # (derated at inf: cand)
            start_rate = _relaxed_fixed_point(cand, ranking, deadline)
        if start_rate is not None and start_rate > 0:
            period, last = cand.samples_per_step / start_rate, start_rate
        for _ in range(FIXED_POINT_ROUNDS):
            if deadline is not None and deadline.expired("the interruptible fixed point"):
                break
            derated = derated_at(cand, period)
            if ranking is None:
                ranking = _Ranking(derated, objective, budget, target, solver_name, deadline)
            else:
                ranking.reslope(derated)
            top = ranking.top(1, math.nan)
            if not top:
                break
            rate = top[0].samples_per_s
            if settles(rate, last):
                last_round = (derated, ranking)
                break
            period, last = cand.samples_per_step / rate, rate
    if last_round is not None:  # the last round's MILP is the answer's (deterministic): its bound, more answers
        derated, ranking = last_round
        found = ranking.top(top_k, ranking.relaxation())
    else:
        derated = derated_at(cand, period)
        if ranking is not None:  # the rounds' MILP at the period they reached
            ranking.reslope(derated)
            found = ranking.top(top_k, ranking.relaxation())
        else:
            found = solve_async_fixed(derated, objective, top_k=top_k, **kw)  # type: ignore[arg-type]
    base = {id(d): o for d, o in zip(derated.engines, cand.engines, strict=True)}
    return [settled(cand, s, tuple((base[id(o)], n) for o, n in s.engines)) for s in found]


def _relaxed_fixed_point(cand: Candidates, ranking: _Ranking, deadline: Deadline | None) -> float:
    """The fixed point's rate on the LP relaxation (LPs, where each MILP round costs its root's cuts):
    an upper bound on the MILP's within its integrality gap, so the MILP rounds that start there
    mostly settle in one (issue 19)."""
    rate = ranking.relaxation()  # no derating
    for _ in range(FIXED_POINT_ROUNDS):
        if not rate > 0 or (deadline is not None and deadline.expired("the interruptible fixed point")):
            break
        ranking.reslope(derated_at(cand, cand.samples_per_step / rate))
        last, rate = rate, ranking.relaxation()
        if settles(rate, last):
            break
    return rate


def lp_bound(cand: Candidates, objective: Objective, budget: float | None, target: float | None,
             solver_name: str = "auto", deadline: Deadline | None = None) -> float:
    """The LP relaxation's objective (nan if it does not solve): no integer plan does better."""
    trainers, engines = list(range(len(cand.trainers))), list(range(len(cand.engines)))
    relaxed = _build(cand, objective, budget, target, trainers, engines, relax=True,
                     in_flight=cand.in_flight_cap(0.0, 0.0), tail=True)
    relaxed.deadline = deadline
    return _relaxed_value(relaxed, objective, solver_name)


def _relaxed_value(model: _Model, objective: Objective, solver_name: str) -> float:
    """`model` solved without integrality: its objective's value (nan if it does not solve)."""
    if not _solve(model, solver_name, relax=True):
        return math.nan
    return float(model.z.varValue if objective == "throughput" else pulp.value(model.prob.objective))


def solve_async_fixed(cand: Candidates, objective: Objective = "throughput", *, budget: float | None = None,
                      target: float | None = None, top_k: int = 1, solver_name: str = "auto", bound: bool = True,
                      deadline: Deadline | None = None) -> list[Solution]:
    """The best `top_k` distinct solutions, each a different trainer option (no-good cuts on y).

    `bound=False` skips the LP relaxation (the fixed point's intermediate rounds need no bound)."""
    if not cand.trainers or not cand.engines:
        return []
    bound_value = lp_bound(cand, objective, budget, target, solver_name, deadline) if bound else math.nan
    return _Ranking(cand, objective, budget, target, solver_name, deadline).top(top_k, bound_value)


class _Ranking:
    """One async MILP and its best distinct answers so far, each a different trainer option (a
    no-good cut on y after each): asking for more continues from the last cut, which is what
    solving the MILP afresh asks again (issue 19: the fixed point's settled round is not re-solved)."""

    def __init__(self, cand: Candidates, objective: Objective, budget: float | None, target: float | None,
                 solver_name: str, deadline: Deadline | None) -> None:
        self.cand, self.solver_name, self.deadline = cand, solver_name, deadline
        self._question = (objective, budget, target)
        self.found: list[Solution] = []
        self.picked: list[int] = []  # each answer's trainer option, cut off (lazily) before the next solve
        self.cuts = 0
        self.model: _Model | None = None  # none: no trainer or no engine option, nothing to rank
        if cand.trainers and cand.engines:
            self.model = _build(cand, objective, budget, target, list(range(len(cand.trainers))),
                                list(range(len(cand.engines))), relax=False, in_flight=cand.in_flight_cap(0.0, 0.0),
                                tail=True)
            self.model.deadline = deadline
        self.ended = self.model is None
        self._reach: tuple[np.ndarray, dict[int, float]] | None = None  # this round's bounds and probes

    def top(self, top_k: int, bound_value: float) -> list[Solution]:
        """The best `top_k` (fewer if the MILP has fewer or the request's bounds stop it), with
        `bound_value` as their LP bound."""
        while len(self.found) < top_k and not self.ended and self.model is not None:
            i = len(self.found)
            if i and self.deadline is not None and self.deadline.expired("the top-k solutions"):
                break
            for c in range(self.cuts, i):
                self.model.prob += self.model.y[self.picked[c]] <= 0, f"nogood{c}"
            self.cuts = i
            if not self._solve_next():
                self.ended = True
                break
            k, chosen = _chosen(self.cand, self.model)
            if not chosen:  # z = 0 is always feasible: no engine fits beside any trainer
                self.ended = True
                break
            self.found.append(priced(self.cand, self.cand.trainers[k], chosen, "async", math.nan,
                                    proven_gap(self.model.prob)))
            self.picked.append(k)
        return [dataclasses.replace(s, lp_bound=bound_value) for s in self.found[:top_k]]

    def _solve_next(self) -> bool:
        """The MILP's next answer, solved without the trainer options whose bound is below the best
        probe not yet cut off (planner.trainer_bounds: each probe is a feasible plan of another trainer,
        so the answer is the same, from a smaller root); an answer below that floor is solved again
        with every option, as one of those left out might beat it."""
        assert self.model is not None
        if self._question[0] != "throughput" or len(self.model.y) < PRUNE_FROM:
            return _solve(self.model, self.solver_name, relax=False)
        if self._reach is None:
            self._reach = self._probe()
        bounds, probed = self._reach
        best = max((v for k, v in probed.items() if k not in self.picked), default=-math.inf)
        floor = best - 1e-6 * abs(best)  # the solver's tolerance
        out = [k for k in self.model.y if bounds[k] < floor and k not in self.picked]
        if out:
            with _left_out(self.model, out):
                ok = _solve(self.model, self.solver_name, relax=False)
            if ok and pulp.value(self.model.prob.objective) >= floor:
                return True
        return _solve(self.model, self.solver_name, relax=False)

    def _probe(self) -> tuple[np.ndarray, dict[int, float]]:
        """Each option's bound, and the objective of the PROBES options of the highest bounds, each
        solved alone (a MILP of its own: PuLP rebuilds every column per solve)."""
        assert self.model is not None and self.cuts == 0, "probes are of the MILP without no-good cuts"
        bounds = objective_bounds(self.cand)
        probed, engines = {}, list(range(len(self.cand.engines)))
        for k in np.argsort(-bounds, kind="stable")[:PROBES]:
            alone = _build(self.cand, *self._question, [int(k)], engines, relax=False,
                           in_flight=self.cand.in_flight_cap(0.0, 0.0), tail=True)
            alone.deadline = self.deadline
            if _solve(alone, self.solver_name, relax=False):
                probed[int(k)] = float(pulp.value(alone.prob.objective))
        return bounds, probed

    def relaxation(self) -> float:
        """lp_bound of this MILP's options: the same model solved without integrality, before any
        no-good cut (the LP lp_bound builds afresh, column for column: the same value, one build fewer)."""
        assert self.cuts == 0, "a MILP with no-good cuts is not its options' relaxation"
        if self.model is None:
            return lp_bound(self.cand, *self._question, self.solver_name, self.deadline)
        return _relaxed_value(self.model, self._question[0], self.solver_name)

    def reslope(self, cand: Candidates) -> None:
        """This MILP for `cand`, the same options at another period's derating (the fixed point's
        next round): its answers start again; the rows but one are kept, not built again."""
        assert self.cuts == 0, "a MILP with no-good cuts is not another round's"
        self.cand, self.found, self.picked, self._reach = cand, [], [], None
        if self.model is not None:
            _reslope(self.model, cand)
            self.ended = False


@contextlib.contextmanager
def _left_out(model: _Model, options: list[int]) -> Iterator[None]:
    """`model` with these trainer options fixed off (y = 0), for one solve."""
    for k in options:
        model.y[k].upBound = 0
    try:
        yield
    finally:
        for k in options:
            model.y[k].upBound = 1


# ---- on-policy: enumerate, then the MILP for the engines ---------------------------------------
def solve_sync(cand: Candidates, objective: Objective = "throughput", *, budget: float | None = None,
               target: float | None = None, top_k: int = 1, solver_name: str = "auto",
               deadline: Deadline | None = None) -> list[Solution]:
    """Disaggregated on-policy: for each trainer and each slowest allowed engine, the best engines.

    Pairs that cannot beat the best found so far (by a cheap bound) are skipped unless top_k needs them.
    The request's bounds (`deadline`) stop the enumeration; the best found by then is returned.
    """
    batch = cand.samples_per_step
    if not cand.engines:
        return []
    tails = sorted({o.tail_seconds for o in cand.engines})
    g_max = batch * max(o.segments[0][1] for o in cand.engines)  # no engine mix beats its best slope
    found: list[Solution] = []
    solves = 0
    for k in sorted(range(len(cand.trainers)), key=lambda k: cand.trainers[k].step_seconds):
        t = cand.trainers[k]
        for longest in tails:
            if deadline is not None and not deadline.may_solve("the on-policy enumeration", solves):
                return _best(found, objective, top_k, budget, target)
            if len(found) >= top_k and _pruned(found, objective, top_k, batch / (max(batch / g_max, longest)
                                                                             + t.step_seconds), t.price_per_hour):
                continue
            need = None
            if target is not None:  # B / (max(B/G, L) + T) >= target  <=>  G >= B / (B/target - T)
                slack = batch / target - t.step_seconds
                if slack < longest:
                    continue
                need = batch / slack
            allowed = [r for r, o in enumerate(cand.engines) if o.tail_seconds <= longest]
            model = _build(cand, objective, budget, need, [k], allowed, relax=False, in_flight=batch,
                           training=False)
            model.deadline, solves = deadline, solves + 1
            if not _solve(model, solver_name, relax=False):
                continue
            _, engines = _chosen(cand, model)
            if engines:
                found.append(priced(cand, t, engines, "sync", math.nan, 0.0))
    return _best(found, objective, top_k, budget, target)


def _pruned(found: list[Solution], objective: Objective, top_k: int, rate_bound: float, cost_floor: float) -> bool:
    if objective == "throughput":
        kth = sorted((s.samples_per_s for s in found), reverse=True)[top_k - 1]
        return rate_bound <= kth
    kth = sorted(s.cost_per_hour for s in found)[top_k - 1]
    return cost_floor >= kth


def solve_colocated(cand: Candidates, objective: Objective = "throughput", *, budget: float | None = None,
                    target: float | None = None, top_k: int = 1) -> list[Solution]:
    """Colocated on-policy: the trainer's GPUs also generate, with one engine TP; enumerated."""
    found = []
    for t in cand.trainers:
        pool = cand.pools[t.pool]
        for o in (o for o in cand.engines if o.pool == t.pool):
            found.append(priced(cand, t, ((o, t.nodes * pool.per_node // o.tp),), "colocated", math.nan, 0.0))
    return _best(found, objective, top_k, budget, target)


def _best(found: list[Solution], objective: Objective, top_k: int, budget: float | None,
          target: float | None) -> list[Solution]:
    ok = [s for s in found if (budget is None or s.cost_per_hour <= budget + 1e-9)
          and (target is None or s.samples_per_s >= target * (1 - 1e-9))]
    if objective == "throughput":
        ranked = sorted(ok, key=lambda s: (-s.samples_per_s, s.cost_per_hour))
    else:
        ranked = sorted(ok, key=lambda s: (s.cost_per_hour, -s.samples_per_s))
    if not ranked:
        return []
    # enumeration is exact: the best found is the bound
    best = ranked[0].samples_per_s if objective == "throughput" else ranked[0].cost_per_hour
    return [dataclasses.replace(s, lp_bound=best) for s in ranked[:top_k]]


def solve(cand: Candidates, mode: Mode, objective: Objective, budget: float | None, target: float | None,
          top_k: int, solver_name: str = "auto", deadline: Deadline | None = None,
          start_rate: float | None = None) -> list[Solution]:
    """The best `top_k` plans of a mode: the async MILP (its fixed point from `start_rate`, see
    solve_async), or the exact on-policy enumerations."""
    kw = {"budget": budget, "target": target, "top_k": top_k, "solver_name": solver_name, "deadline": deadline}
    if mode == "async":
        return solve_async(cand, objective, start_rate=start_rate, **kw)  # type: ignore[arg-type]
    if mode == "sync":
        return solve_sync(cand, objective, **kw)  # type: ignore[arg-type]
    return solve_colocated(cand, objective, budget=budget, target=target, top_k=top_k)
