"""The planner's bounds: one wall clock and one count of work for a whole request, checked inside
every long loop (the on-policy enumeration, the fixed-point rounds, re-ranking, refinement and the
engine-mix search), so no input can make `plan` run without end.

A bound that is hit stops the loop where it is: the best plan found so far is returned and the
request's notes say, in one line, which bound stopped which search (PlanReport.notes). Only when
nothing was found yet is it an error (SpecError, one line).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from traces import SpecError

PLAN_SECONDS = 600.0  # one request's wall clock, as one simulation's (sim.recorder.MAX_WALL_SECONDS)
# simulations per request: screening runs (top-k, tiers, refinement, engine mixes, targets) and the
# settling runs of planner.confirm together; 48 screening runs, as before settling runs were counted,
# plus at least SETTLING_RUNS settling runs. The baselines' runs are bounded by the clock alone.
MAX_SIMULATIONS = 54
# settling runs (planner.confirm) held back from the screening runs' share of the count, so that a
# search which spends its bound still settles its answer (at most half of a smaller bound)
SETTLING_RUNS = 6
MAX_SOLVES = 5_000  # MILP solves per enumeration (on-policy: trainers x slowest engine allowed)


@dataclass
class Deadline:
    """A request's bounds: `seconds` of wall clock and `simulations` simulated plans. Stateful on
    purpose: it remembers the first bound hit, which the report prints."""

    seconds: float = PLAN_SECONDS
    simulations: int = MAX_SIMULATIONS
    solves: int = MAX_SOLVES
    reserve: int = SETTLING_RUNS  # simulations held back from screening for settling runs (`reserved`)
    start: float = field(default_factory=time.monotonic)
    simulated: int = 0
    hit: str | None = None  # the first bound hit, one line

    def left(self) -> float:
        return self.seconds - (time.monotonic() - self.start)

    def expired(self, where: str) -> bool:
        """Whether the wall clock is spent; the first time, note where it stopped."""
        if self.left() > 0:
            return False
        self._note(f"{where} stopped at the planner's {self.seconds:g} s bound")
        return True

    def may_simulate(self, where: str, *, settling: bool = False) -> bool:
        """Whether one more plan may be simulated (the count and the clock). Screening runs stop
        short of the count by the settling runs held back for the answer (`reserved`)."""
        if self.expired(where):
            return False
        if self.simulated >= self.simulations - (0 if settling else self.reserved()):
            self._note(f"{where} stopped at the planner's bound of {self.simulations} simulated plans")
            return False
        return True

    def reserved(self) -> int:
        """The simulations held back from screening for settling runs."""
        return min(self.reserve, self.simulations // 2)

    def may_solve(self, where: str, done: int) -> bool:
        """Whether an enumeration that has made `done` solves may make another."""
        if self.expired(where):
            return False
        if done >= self.solves:
            self._note(f"{where} stopped at the planner's bound of {self.solves} MILP solves")
            return False
        return True

    def nothing_found(self) -> SpecError:
        """The error when a bound stopped the search before it found any plan."""
        return SpecError(f"planning stopped before any plan was found: {self.hit or 'a bound was hit'}; raise "
                         "--max-seconds or plan a smaller fleet")

    def _note(self, line: str) -> None:
        if self.hit is None:
            self.hit = line
