"""Timeouts to an absolute time, so that a decode jump laid out as a running sum ends exactly where a chain of
consecutive timeouts would (simpy adds each delay to `now`: the laid-out sum must see the same roundings)."""

from __future__ import annotations

import math

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
