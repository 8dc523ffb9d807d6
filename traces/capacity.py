"""The capacity rule's ledger (what may be admitted, when a step is ready, what it takes) and the
KV-cache admission rule of one engine (vLLM's watermark), shared by every simulated controller.

The rule itself (AReaL's: at most (eta + v + 1) B samples ever admitted, and the staleness-safe
choice of the B oldest completed ones) is traces.staleness; `CapacityLedger` keeps the counts it
reads (admitted, in flight and buffered per start version) and the buffer of completed samples, in
whatever form the caller keeps them (numpy id arrays in the fast path, objects in the reference).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import numpy as np

from traces.staleness import allowance, batch_levels, batch_ready, shortfalls

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
    eta: int
    total: int
    version: int = 0
    admitted: int = 0
    in_flight: Counter[int] = field(default_factory=Counter)  # start version -> admitted, not yet buffered
    buffered_by: Counter[int] = field(default_factory=Counter)  # start version -> buffered, not yet trained
    buffered: int = 0
    pools: dict[int, list[C]] = field(default_factory=dict)

    def allowance(self) -> int:
        """Samples that may be admitted now (none past the last one drawn)."""
        return min(allowance(self.eta, self.version, self.batch, self.admitted), self.total - self.admitted)

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

    def shortfalls(self, step: int) -> dict[int, int]:
        """Completions still missing per start version before `step` is ready (traces.staleness)."""
        return shortfalls(step, self.eta, self.batch, self.in_flight, self.buffered_by)

    def ready(self, step: int) -> bool:
        """Step `step` may take the B oldest buffered samples without breaking the bound later."""
        return batch_ready(step, self.eta, self.batch, self.in_flight, self.buffered_by)

    def take(self, merge: Callable[[list[C]], C]) -> list[C]:
        """Remove the B oldest buffered samples, by start version then id: one sorted piece per
        level taken. `merge` joins a level's chunks into one, sorted by id."""
        out: list[C] = []
        for level, n in batch_levels(self.buffered_by, self.batch).items():
            pool = merge(self.pools.pop(level))
            out.append(pool[:n])
            if n < len(pool):
                self.pools[level] = [pool[n:]]
            self.buffered_by[level] -= n
            if not self.buffered_by[level]:
                del self.buffered_by[level]
        self.buffered -= sum(len(piece) for piece in out)
        return out
