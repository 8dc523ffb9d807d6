"""The update derating's fixed point, shared by the async MILP's rounds (planner.milp.solve_async):
its rules, and an answer's rate at its own period.

Interruptible rollouts lose each step's weight wait and KV re-prefill, a share of the step period
B / z, and the others drain their batch before each update (planner.tail_model): so the engines'
slopes depend on the rate they serve. The MILP is solved at one period's derating, the next round at
its answer's period, until a round lands within 1% of the one before (at most FIXED_POINT_ROUNDS).
"""

from __future__ import annotations

import dataclasses
import math

from planner.candidates import Candidates, EngineOption
from planner.rate_model import Solution, evaluate, priced
from planner.rate_reach import reaches

FIXED_POINT_ROUNDS = 4


def derated_at(cand: Candidates, period: float) -> Candidates:
    """`cand` with every engine option derated for updates every `period` seconds."""
    return dataclasses.replace(cand, engines=tuple(o.derated(period) for o in cand.engines))


def settles(rate: float, last: float) -> bool:
    """The fixed point's stopping rule: a round within 1% of the round before it."""
    return abs(rate - last) <= 0.01 * rate


def settled(cand: Candidates, sol: Solution, engines: tuple[tuple[EngineOption, int], ...]) -> Solution:
    """`sol` with its rate at its own period: the z with z = rate(engines derated for B / z), by
    bisection (the rate falls as z grows, since a shorter period loses a larger share to each
    update), so that a plan solved for a target's period still meets the target at its own."""
    batch = cand.samples_per_step

    def at(z: float) -> tuple[tuple[EngineOption, int], ...]:
        return tuple((o.derated(batch / z if z > 0 else math.inf), n) for o, n in engines)

    hi = evaluate(cand, sol.trainer, at(0.0), "async")[0]
    lo = 0.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if mid <= 0 or hi - lo <= 1e-9 * hi:
            break
        # evaluate(...)[0] >= mid, with the rate's own bisection stopped once the answer is known
        lo, hi = (mid, hi) if reaches(cand, sol.trainer, at(mid), mid) else (lo, mid)
    return priced(cand, sol.trainer, at(lo), "async", sol.lp_bound, sol.gap) if lo > 0 else sol
