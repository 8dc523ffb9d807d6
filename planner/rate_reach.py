"""Whether an allocation's asynchronous rate reaches z: `evaluate(...)[0] >= z`, answered with less work.

planner.milp.settled bisects for the z at which an allocation's rate, at the period B / z, is z;
each of its steps asks only whether the rate reaches z, and the rate itself is a bisection of its
own (planner.rate_model._async_rate, 100 halvings of [0, training rate]). `reaches` runs that same
bisection, on the same floats, and stops as soon as the answer is known: its lower end only rises
and never passes its upper end, so once the lower end is at z the rate is at least z, and once the
upper end is below z the rate is below z. The in-flight samples' generation is the same sum over
the same sorted pieces as planner.rate_model.generation, sorted once instead of at every halving.
The answer is the full computation's, bit for bit (tests/test_rate_reach.py), so the plans are too.
"""

from __future__ import annotations

from planner.candidates import Candidates, EngineOption, TrainerOption
from planner.rate_model import RATE_HALVINGS, RATE_TOLERANCE, fill, slope_pieces


def reaches(cand: Candidates, trainer: TrainerOption, engines: tuple[tuple[EngineOption, int], ...],
            z: float) -> bool:
    """`planner.rate_model.evaluate(cand, trainer, engines, "async")[0] >= z`, exactly."""
    pieces = slope_pieces(engines)  # sorted once: planner.rate_model.generation sorts at every call

    def short(x: float) -> bool:
        return fill(pieces, cand.in_flight_cap(trainer.step_seconds, x)) < x

    hi = trainer.samples_per_s
    if z > hi:  # the rate is never above the training rate
        return False
    if not short(hi):  # the rate is the training rate
        return True
    lo = 0.0
    for _ in range(RATE_HALVINGS):
        if lo >= z:  # the rate is the last lower end, which only rises
            return True
        if hi < z:  # the lower end never passes the upper one
            return False
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if short(mid) else (mid, hi)
        if hi - lo <= RATE_TOLERANCE * hi:
            break
    return lo >= z
