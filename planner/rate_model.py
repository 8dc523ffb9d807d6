"""The analytic rate model: what the MILP ranks on (`evaluate`), and what its answer is priced by (`raced`).

`evaluate` is the MILP's own model, so the MILP's optimum equals a brute force over it
(tests/test_planner.py): asynchronous engines hold the in-flight samples spread to the best slopes
of their concave rate curves, derated segment by segment for each step's update (planner.candidates
EngineOption.derated); on-policy plans alternate a batch's drain and a trainer step.

The simulator does not spread samples to the best slopes: its router sends each sample to the
accepting engine whose next iteration would be shortest with one more (traces.routing), so every
engine sits at the same iteration time, and an engine that is slow per iteration (an L40S TP2 next
to H200s) may hold nothing at all. And an interruptible engine's update pause u(b) (the weights,
then the re-prefill of all b samples it holds) stops all b of them, so its rate at load b is
r(b) (1 - u(b) / period), not the segment-wise derating, which prices the k-th sample's own loss
only and misses the longer pause it puts on the other k - 1. `raced` prices the MILP's answer by
those rules: interruptible engines at their routed loads with that derating (`_routed`), unless
none holds a sample when a step publishes (then nothing is interrupted: they run the race), engines
that are not interruptible by their race for each version (planner.tail_model.race), and
on-policy plans by the same race with eta = 0 (the simulator runs sync as async with eta 0: each
batch routed to empty engines, the step waiting for its longest sample, on whichever engine it
landed). The MILP still ranks on its slopes: these are too slow to price every candidate.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from planner.candidates import Candidates, EngineOption, TrainerOption
from planner.tail_model import Race, race

Mode = Literal["async", "sync", "colocated"]


@dataclass(frozen=True)
class Solution:
    trainer: TrainerOption
    engines: tuple[tuple[EngineOption, int], ...]  # (option, count), counts > 0
    samples_per_s: float  # analytic
    generation_per_s: float  # what the engines sustain under the in-flight cap
    training_per_s: float
    tail_per_s: float  # on-policy: B / the slowest engine's longest sample (inf for async)
    cost_per_hour: float
    lp_bound: float  # the LP relaxation's objective: no plan can do better
    gap: float  # proven optimality gap of this solution (0 for exact enumeration)
    mode: Mode = "async"

    @property
    def bottleneck(self) -> str:
        if self.mode != "async":
            return "alternation: generation and training take turns"
        g, t = self.generation_per_s, self.training_per_s
        if abs(g - t) <= 0.02 * max(g, t):
            return "balanced: generation and training"
        return "generation" if g < t else "training"



RATE_HALVINGS = 100  # `_async_rate`'s bisection: at most this many halvings,
RATE_TOLERANCE = 1e-12  # stopped once its width is this share of the upper end


def slope_pieces(engines: tuple[tuple[EngineOption, int], ...]) -> list[tuple[float, float]]:
    """(slope, width) of every engine's segments, best slope first: what `generation` fills."""
    return sorted(((slope, width * n) for o, n in engines for width, slope in o.segments), reverse=True)


def generation(engines: tuple[tuple[EngineOption, int], ...], in_flight: float) -> float:
    """Samples/s of these engines holding at most `in_flight` samples, spread to the best slopes."""
    return fill(slope_pieces(engines), in_flight)


def fill(pieces: list[tuple[float, float]], in_flight: float) -> float:
    """Samples/s of `in_flight` samples spread over sorted `pieces` (slope_pieces), best first."""
    out, left = 0.0, float(in_flight)
    for slope, width in pieces:
        take = min(width, left)
        out, left = out + take * slope, left - take
        if left <= 0:
            break
    return out


def evaluate(cand: Candidates, trainer: TrainerOption, engines: tuple[tuple[EngineOption, int], ...],
             mode: Mode = "async") -> tuple[float, float, float, float, float]:
    """(samples/s, generation, training, tail ceiling, $/h) of one allocation, analytically (the
    MILP's slope model; `raced` prices engines that are not interruptible by their race)."""
    batch = cand.samples_per_step
    shared = mode == "colocated"
    cost = trainer.price_per_hour + (0.0 if shared else sum(o.price_per_hour * n for o, n in engines))
    if mode == "async":
        rate = _async_rate(cand, trainer, engines)
        gen = generation(engines, cand.in_flight_cap(trainer.step_seconds, rate))
        return rate, gen, trainer.samples_per_s, math.inf, cost
    gen = generation(engines, batch)
    longest = max((o.tail_seconds for o, n in engines if n > 0), default=math.inf)
    switch = 2 * trainer.switch_seconds if shared else 0.0
    step = max(batch / gen, longest) + trainer.step_seconds + switch if gen > 0 else math.inf
    return batch / step, gen, trainer.samples_per_s, batch / longest, cost


def priced(cand: Candidates, trainer: TrainerOption, engines: tuple[tuple[EngineOption, int], ...], mode: Mode,
           lp_bound: float, gap: float) -> Solution:
    """The Solution of one allocation, its figures by `evaluate`."""
    rate, gen, train, tail, cost = evaluate(cand, trainer, engines, mode)
    return Solution(trainer, engines, rate, gen, train, tail, cost, lp_bound, gap, mode)


def raced(cand: Candidates, sol: Solution) -> Solution:
    """`sol` priced by the simulator's routing and update rules (the module docstring); `sol` itself
    where they do not apply (colocated plans, multi-turn episodes, dynamic sampling)."""
    if sol.mode == "async" and cand.interruptible:
        # one that holds nothing when the weights are published is never interrupted: it runs the race
        outcome = _race(cand, sol.trainer, sol.engines, sol.mode, held_only=True)
        priced = outcome.samples_per_s if not outcome.held_at_publish else _routed(cand, sol.trainer, sol.engines)
    elif sol.mode in ("async", "sync"):
        priced = _race(cand, sol.trainer, sol.engines, sol.mode).samples_per_s
    else:
        priced = math.nan
    if not math.isfinite(priced):
        return sol
    if sol.mode != "async":
        return dataclasses.replace(sol, samples_per_s=priced)
    gen = priced if priced < sol.trainer.samples_per_s * (1 - 1e-9) else sol.generation_per_s  # generation-bound
    return dataclasses.replace(sol, samples_per_s=priced, generation_per_s=gen)


def _race(cand: Candidates, trainer: TrainerOption, engines: tuple[tuple[EngineOption, int], ...], mode: Mode,
          held_only: bool = False) -> Race:
    """planner.tail_model.race for engines that are not interruptible, or on-policy (eta 0: a sync
    step is an async one that may not run ahead); nan (held) where it does not apply."""
    if cand.generated_per_trained != 1 or not engines or any(o.drain is None for o, _ in engines):
        return Race(math.nan, True)
    eta = cand.staleness if mode == "async" else 0.0
    curves = tuple((o.drain, o.drain.accepts, n) for o, n in engines if n > 0)  # type: ignore[union-attr]
    return race(curves, cand.samples_per_step, eta, trainer.step_seconds,  # type: ignore[arg-type]
                min(cand.sync_seconds, trainer.step_seconds), held_only)


SAWTOOTH = 8  # loads along a version's in-flight sawtooth an interruptible engine's rate is averaged over


def _routed(cand: Candidates, trainer: TrainerOption, engines: tuple[tuple[EngineOption, int], ...]) -> float:
    """Samples/s of interruptible engines at the loads the router gives them: the largest z <= the
    training rate with sum_e n_e mean_x r_e(b_e(x)) (1 - u_e(b_e(0)) B / z) >= z, r_e the engine's
    undisturbed curve, u_e its update pause (nan without keys). A version's allowance of B samples is
    admitted when its weights are published and finishes over the period B / z, so the samples in
    flight run a sawtooth about the in-flight cap I at z (Candidates.in_flight_cap), I - B / 2 + x B
    for x in [0, 1): the loads b_e(x) water-filled on the router's keys (routed_loads), the rate their
    mean along it, and the re-prefill stops what is held at a publish, b_e(0). (bench/analytic_vs_sim.py
    seed 3 #45: the simulator's H20s re-prefill 110 held samples where they run 148 on average; a pause
    priced at the mean load had put the fleet at 0.73 of the simulated rate.)"""
    base = {(o.pool, o.tp, o.ep): o for o in cand.engines}  # the solution's options come derated
    rows = [(base.get((o.pool, o.tp, o.ep), o), n) for o, n in engines if n > 0]
    if cand.generated_per_trained != 1 or not rows or any(not o.keys or not o.update_seconds for o, _ in rows):
        return math.nan
    points = [np.cumsum([w for w, _ in o.segments]) for o, _ in rows]
    batch = cand.samples_per_step

    def generated(z: float) -> float:
        period, mean = batch / z, cand.in_flight_cap(trainer.step_seconds, z)
        along = [routed_loads(rows, points, max(0.0, mean + batch * ((k + 0.5) / SAWTOOTH - 0.5)))
                 for k in range(SAWTOOTH)]
        held = routed_loads(rows, points, max(0.0, mean - batch / 2))
        return sum(n * float(np.mean([o.rate(loads[e]) for loads in along]))
                   * max(0.0, 1.0 - float(np.interp(held[e], p, o.update_seconds)) / period)
                   for e, ((o, n), p) in enumerate(zip(rows, points, strict=True)))

    hi = trainer.samples_per_s
    if generated(hi) >= hi:
        return hi
    lo = 0.0
    for _ in range(60):  # generated(z) falls as z grows (a shorter period, a smaller cap): one crossing
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if generated(mid) >= mid else (lo, mid)
        if hi - lo <= 1e-9 * hi:
            break
    return lo


def routed_loads(rows: list[tuple[EngineOption, int]], points: list[np.ndarray], in_flight: float) -> list[float]:
    """Samples each engine of `rows` (option, count) holds when `in_flight` are routed to the least key
    with one more (traces.routing): the key level that places them, by bisection, each engine holding
    the slots whose key is below it (keys rise with load, tabulated at `points`; none below its
    one-sample key), up to its batch; scaled to place exactly `in_flight`."""
    def at(level: float) -> list[float]:
        return [min(float(o.batch), float(np.interp(level, o.keys, p, left=0.0))) for (o, _), p in
                zip(rows, points, strict=True)]

    def placed(loads: list[float]) -> float:
        return sum(n * b for (_, n), b in zip(rows, loads, strict=True))

    if in_flight >= sum(n * o.batch for o, n in rows):
        return [float(o.batch) for o, _ in rows]
    lo, hi = 0.0, max(o.keys[-1] for o, _ in rows)
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if placed(at(mid)) < in_flight else (lo, mid)
    loads = at(hi)
    return [b * in_flight / max(placed(loads), 1e-12) for b in loads]


def _async_rate(cand: Candidates, trainer: TrainerOption, engines: tuple[tuple[EngineOption, int], ...]) -> float:
    """The largest z with z <= training and z <= generation under the in-flight cap at z (which
    falls as z grows: Candidates.in_flight_cap), by bisection: the MILP's optimum for this allocation."""
    def short(z: float) -> bool:
        return generation(engines, cand.in_flight_cap(trainer.step_seconds, z)) < z

    hi = trainer.samples_per_s
    if not short(hi):
        return hi
    lo = 0.0
    for _ in range(RATE_HALVINGS):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if short(mid) else (mid, hi)
        if hi - lo <= RATE_TOLERANCE * hi:
            break
    return lo
