"""The capacity rule's ledger (what may be admitted, when a step is ready, what it takes) and the
KV-cache admission rule of one engine (vLLM's watermark), shared by every simulated controller.

The rule itself (AReaL's: at most (eta + v + 1) B samples ever admitted, and the staleness-safe
choice of the B oldest completed ones) is traces.staleness; `CapacityLedger` keeps the counts it
reads (admitted, in flight and buffered per start version) and the buffer of completed samples, in
whatever form the caller keeps them (numpy id arrays in the fast path, objects in the reference).

DAPO's dynamic sampling (Yu et al. 2025, arXiv 2503.14476, sec. 3.2; verl's `filter_groups` with
`gen_batch_size`) drops groups whose rewards are all equal and keeps generating until the batch
is full: a completed sample is then either accepted into the buffer or dropped (`drop`), and the
rule bounds accepted samples instead. With K accepted so far, U in flight and C the rule's cap,
`oversample` o lets U reach floor(o (C - K)): o = 1 admits exactly what the batch still lacks
(drops are replaced as they are known), o > 1 runs ahead as verl's larger generation batch does,
and samples that pass once the cap is met are surplus, dropped too (`accept`). With no drops and
o = 1 this is C - admitted, the plain rule.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import numpy as np

from traces.staleness import admission_cap, allowance, batch_levels, batch_ready, shortfalls

KV_WATERMARK = 0.01  # vLLM's block manager keeps 1% of KV blocks free when it admits (watermark)


def kv_room(kv_tokens: float | np.ndarray) -> float | np.ndarray:
    """KV tokens an engine may fill by admitting: its cache less the watermark."""
    return kv_tokens * (1 - KV_WATERMARK)


def fits_kv(context: float | np.ndarray, tokens: int | np.ndarray, room: float | np.ndarray) -> bool | np.ndarray:
    """A sample of `tokens` joins a KV context with a token to spare (scalars or arrays alike): a
    preempted sample re-admitted with none to spare would overflow and be preempted again at once."""
    return context + tokens + 1 <= room


def admits(running: int, pending: int, max_batch: int, context: float, tokens: int, room: float) -> bool:
    """vLLM admits the next sample while the batch has a slot and it fits the KV room; an empty
    engine always takes one, however long (`pending`: samples already admitted this round)."""
    if running + pending >= max_batch:
        return False
    return (not running and not pending) or bool(fits_kv(context, tokens, room))


C = TypeVar("C", list, np.ndarray)  # a chunk of completed samples: a list of objects, or an array of ids


@dataclass
class CapacityLedger(Generic[C]):
    """The capacity rule's counts over `total` samples, ids 0, 1, ... in admission order, and the
    buffer of completed ones: `pools[L]` holds the chunks completed at start version L."""

    batch: int
    eta: float
    total: int
    chunk: int = 0  # samples a step takes at a time, as they complete (streaming); 0: its whole batch
    version: int = 0
    admitted: int = 0
    in_flight: Counter[int] = field(default_factory=Counter)  # start version -> admitted, not yet buffered
    buffered_by: Counter[int] = field(default_factory=Counter)  # start version -> buffered, not yet trained
    buffered: int = 0
    pools: dict[int, list[C]] = field(default_factory=dict)
    step_taken: int = 0  # samples the step in progress has taken so far (streaming chunks)
    oversample: float = 1.0  # dynamic sampling: in flight up to this times what the batch still lacks
    accepted: int = 0  # samples ever buffered (trained or not)
    dropped: int = 0  # samples completed and dropped (filtered by dynamic sampling, or surplus)
    accepted_by: Counter[int] = field(default_factory=Counter)  # start version -> accepted (oversample > 1)

    @property
    def take_size(self) -> int:
        """Samples the next take hands over: a chunk, or the whole batch."""
        return self.chunk or self.batch

    def _rest(self) -> int:
        return self.batch - self.step_taken - self.take_size

    def allowance(self) -> int:
        """Samples that may be admitted now (none past the last one drawn)."""
        left = self.total - self.admitted
        if not self.dropped and self.oversample == 1:
            return min(allowance(self.eta, self.version, self.batch, self.admitted), left)
        in_flight = self.admitted - self.accepted - self.dropped
        lacking = admission_cap(self.eta, self.version, self.batch) - self.accepted
        return min(math.floor(self.oversample * lacking + 1e-9) - in_flight, left)

    def accept(self, level: int, passing: int) -> int:
        """How many of `passing` completions of start version `level` (that passed the filter) the rule
        still takes: accepted samples of versions <= L stay within the cap of every version L >= level."""
        if self.oversample == 1:  # in flight never exceeds what the batch lacks: all fit
            return passing
        top = max(level, max(self.accepted_by, default=level))
        upto = sum(n for lv, n in self.accepted_by.items() if lv <= level)
        room = passing
        for lv in range(level, top + 1):
            if lv > level:
                upto += self.accepted_by.get(lv, 0)
            room = min(room, admission_cap(self.eta, lv, self.batch) - upto)
        return max(room, 0)

    def drop(self, level: int, n: int) -> None:
        """n samples of start version `level` completed and were dropped (filtered, or surplus)."""
        self.in_flight[level] -= n
        self.dropped += n

    def admit(self, n: int) -> int:
        """n samples start at the current version; the first one's id (the others follow)."""
        first = self.admitted
        self.admitted += n
        self.in_flight[self.version] += n
        return first

    def buffer(self, level: int, chunk: C, n: int) -> None:
        """n samples (`chunk`) of start version `level` completed into the buffer."""
        self.in_flight[level] -= n
        self.buffered_by[level] += n
        self.pools.setdefault(level, []).append(chunk)
        self.buffered += n
        self.accepted += n
        if self.oversample != 1:
            self.accepted_by[level] += n

    def shortfalls(self, step: int) -> dict[int, int]:
        """Completions still missing per start version before `step` is ready (traces.staleness)."""
        return shortfalls(step, self.eta, self.batch, self.in_flight, self.buffered_by, self.take_size, self._rest())

    def ready(self, step: int) -> bool:
        """Step `step` may take the next chunk (the B oldest buffered samples unless streaming)
        without breaking the bound later."""
        return batch_ready(step, self.eta, self.batch, self.in_flight, self.buffered_by, self.take_size,
                           self._rest())

    def take(self, merge: Callable[[list[C]], C]) -> list[C]:
        """Remove the next chunk (the B oldest buffered samples unless streaming), by start version
        then id: one sorted piece per level taken. `merge` joins a level's chunks into one, sorted by id."""
        out: list[C] = []
        size = self.take_size
        self.step_taken = (self.step_taken + size) % self.batch
        for level, n in batch_levels(self.buffered_by, size).items():
            pool = merge(self.pools.pop(level))
            out.append(pool[:n])
            if n < len(pool):
                self.pools[level] = [pool[n:]]
            self.buffered_by[level] -= n
            if not self.buffered_by[level]:
                del self.buffered_by[level]
        self.buffered -= sum(len(piece) for piece in out)
        return out
