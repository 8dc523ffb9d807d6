"""Timeouts to an absolute time, so that a decode jump laid out as a running sum ends exactly where a chain of
consecutive timeouts would (simpy adds each delay to `now`: the laid-out sum must see the same roundings)."""

from __future__ import annotations

import math
from collections.abc import Callable

import simpy


def timeout_at(env: simpy.Environment, when: float) -> simpy.Timeout:
    """A timeout that fires at exactly `when` (>= now): `now + delay` is nudged by ulps to equal it."""
    now = env.now
    delay = when - now
    while now + delay < when:
        delay = math.nextafter(delay, math.inf)
    while delay > 0 and now + delay > when:
        delay = math.nextafter(delay, -math.inf)
    return env.timeout(max(delay, 0.0))


class Alarm:
    """Calls `ring` when `due()` (the earliest filed time) comes, then re-arms; `soon()` re-arms at the end
    of this instant, once however many engines ask. A newer arming voids the older ones: a simpy timeout
    cannot be withdrawn, so each carries its generation. Used for the episodes' tool returns
    (sim.tool_calls) and dynamic sampling's drops (sim.controller)."""

    def __init__(self, env: simpy.Environment, due: Callable[[], float], ring: Callable[[], None]) -> None:
        self.env, self._due, self._ring = env, due, ring
        self._generation = 0
        self._pending = False

    def soon(self) -> None:
        if not self._pending:
            self._pending = True
            self.env.timeout(0).callbacks.append(self._arm)

    def _arm(self, _event: simpy.Event | None = None) -> None:
        self._pending = False
        self._generation += 1
        when = self._due()
        if when < math.inf:
            generation = self._generation
            timeout_at(self.env, when).callbacks.append(lambda _ev: self._rang(generation))

    def _rang(self, generation: int) -> None:
        if generation == self._generation:
            self._ring()
            self._arm()
