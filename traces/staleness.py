"""AReaL's capacity rule and the staleness-safe batch selection, without any clock or engine.

The runtime admits and trains through it; the simulator's controller applies the same rule.

Units are whatever the caller admits atomically: the loop admits GRPO groups, so `batch` is prompts
per step. With trainer version v, at most (eta + v + 1) * batch units may ever have been admitted.
An item admitted at version L has every token at version >= L, and step s trains with weights of
version s, so its tokens are at most s - L versions old: step s must train every item with
L <= s - eta, and items with L > s - eta have L + eta - s later steps left to be trained in. A step
takes the `batch` oldest completed items only if, afterwards, for every level L the untrained items
of versions <= L fit in the batches of the steps still allowed for them. Waiting for completions
always makes this true (by induction over steps), so nothing is dropped or trained twice and no
trained token is older than eta versions.

eta may be a fraction of a batch, as verl's fully-async `async_training.staleness_threshold` is:
at most floor((eta + v + 1) B) units are admitted, so with eta = 0.5 half a batch runs ahead of
each version. Those units are trained one step later, so the version lag is bounded by
ceil(eta) (`lag_bound`): the selection rule above runs with ceil(eta), which the tighter
admission keeps reachable. A step may also be trained in chunks as they complete (streaming, the
trainer starting on the first chunk): each chunk is taken by the same rule, the rest of the step's
batch counting as room for every level still untrained.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


def admission_cap(eta: float, version: int, batch: int) -> int:
    """Units ever admitted by version `version`: floor((eta + version + 1) * batch) (exact for whole eta)."""
    return math.floor((eta + version + 1) * batch + 1e-9)  # 1e-9: 0.1 * 10 is 1, not 0.999...


def lag_bound(eta: float) -> int:
    """The most versions a trained token may lag under bound eta: ceil(eta)."""
    return math.ceil(eta - 1e-9)


def allowance(eta: float, version: int, batch: int, admitted: int) -> int:
    """Units that may be admitted now: at most floor((eta + version + 1) * batch) ever."""
    return admission_cap(eta, version, batch) - admitted


def batch_levels(buffered_by: Mapping[int, int], batch: int) -> dict[int, int]:
    """How many units of each start version the next batch (the `batch` oldest completed) takes."""
    out, need = {}, batch
    for level in sorted(buffered_by):
        n = min(need, buffered_by[level])
        if n:
            out[level], need = n, need - n
        if need == 0:
            break
    return out


def shortfalls(step: int, eta: float, batch: int, in_flight: Mapping[int, int], buffered_by: Mapping[int, int],
               take: int | None = None, rest: int = 0) -> dict[int, int]:
    """Per start version L, how many more completions of versions <= L step `step` still needs.

    A completion only moves a unit from in flight to the buffer, so `batch_ready`'s condition is a
    count per L: buffered(<= L) >= total(<= L) - allowed(L), and buffered(<= step) >= batch. Empty
    means ready; each completion at version v lowers every shortfall at L >= v by one, which lets a
    caller wake its trainer only when they all reach zero. `take` units (default: the batch) are
    taken now and `rest` more later in the same step (streaming chunks).
    """
    lag, take = lag_bound(eta), batch if take is None else take
    out: dict[int, int] = {}
    levels = [lv for lv, n in in_flight.items() if n > 0] + [lv for lv, b in buffered_by.items() if b]
    total = buffered = 0
    for level in range(min(levels, default=step), step + 1):
        here = buffered_by.get(level, 0)
        total += in_flight.get(level, 0) + here
        buffered += here
        need = total - rest - max(0, level + lag - step) * batch
        if level == step:
            need = max(need, take)
        if need > buffered:
            out[level] = need - buffered
    return out


def batch_ready(step: int, eta: float, batch: int, in_flight: Mapping[int, int], buffered_by: Mapping[int, int],
                take: int | None = None, rest: int = 0) -> bool:
    """Step `step` may train the `take` (default `batch`) oldest completed units, `rest` more of the
    step's batch to follow, without breaking the bound later."""
    lag, take = lag_bound(eta), batch if take is None else take
    if sum(buffered_by.values()) < take:
        return False
    taken = batch_levels(buffered_by, take)
    untrained: Counter[int] = Counter(in_flight)
    for level, n in buffered_by.items():
        untrained[level] += n - taken.get(level, 0)
    left = 0
    for level in range(min((lv for lv, n in untrained.items() if n > 0), default=step), step + 1):
        left += untrained.get(level, 0)
        if left > rest + max(0, level + lag - step) * batch:
            return False
    return True


@dataclass(frozen=True)
class Admitted(Generic[T]):
    """A completed unit waiting in the buffer: its start version, an id for order, the payload."""

    start_version: int
    uid: int
    item: T


@dataclass
class CapacityController(Generic[T]):
    batch: int
    eta: float
    version: int = 0
    admitted: int = 0
    in_flight: Counter[int] = field(default_factory=Counter)  # start version -> admitted, not completed
    buffer: dict[int, list[Admitted[T]]] = field(default_factory=dict)  # start version -> completed, untrained

    def __post_init__(self) -> None:
        if self.batch < 1 or self.eta < 0:
            raise ValueError(f"need batch >= 1 and eta >= 0, got batch={self.batch}, eta={self.eta}")

    @property
    def buffered(self) -> int:
        return sum(len(v) for v in self.buffer.values())

    def allowance(self) -> int:
        """Units that may be admitted now without breaking (eta + v + 1) * batch."""
        return allowance(self.eta, self.version, self.batch, self.admitted)

    def admit(self) -> tuple[int, int]:
        """Admit one unit at the current version; returns (uid, start version)."""
        if self.allowance() <= 0:
            raise RuntimeError("capacity rule: no allowance left at this version")
        uid = self.admitted
        self.admitted += 1
        self.in_flight[self.version] += 1
        return uid, self.version

    def complete(self, uid: int, start_version: int, item: T) -> None:
        if self.in_flight[start_version] <= 0:
            raise RuntimeError(f"unit {uid} completed at version {start_version} but none is in flight there")
        self.in_flight[start_version] -= 1
        self.buffer.setdefault(start_version, []).append(Admitted(start_version, uid, item))

    def _counts(self) -> dict[int, int]:
        return {level: len(units) for level, units in self.buffer.items()}

    def ready(self, step: int) -> bool:
        """Step `step` may train the `batch` oldest completed units without breaking the bound later."""
        return batch_ready(step, self.eta, self.batch, self.in_flight, self._counts())

    def take(self) -> list[Admitted[T]]:
        """Remove and return the `batch` oldest completed units, by start version then uid."""
        batch: list[Admitted[T]] = []
        for level, n in batch_levels(self._counts(), self.batch).items():
            pool = sorted(self.buffer.pop(level), key=lambda a: a.uid)
            batch.extend(pool[:n])
            if pool[n:]:
                self.buffer[level] = pool[n:]
        return batch

    def new_version(self, version: int) -> None:
        self.version = version
