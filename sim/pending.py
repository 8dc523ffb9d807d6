"""Completions that engines have planned ahead but that have not reached the trainer's buffer yet.

An engine decoding a fixed batch knows when each of its samples will finish; it files them here
instead of one simulation event per sample. Every filing is a set of "parts" (one per engine plan:
a whole fleet of engines planning together files one part each in one call), and a part is cut
back when its plan is interrupted: only its first `keep` completions happen.

All undelivered completions live in one index sorted by time (ties: in the order filed). A filing
is merged into it (a sort of the new entries and one insertion), not re-sorted with the rest, and a
cut only lowers its part's limit: entries past the limit are skipped when read and dropped at the
next compaction. The controller takes what is due whenever it looks, and asks `kth_time` when
enough completions will be in for the trainer's next step.
"""

from __future__ import annotations

import numpy as np

EMPTY = np.empty(0, np.int64)
NO_LIMIT = np.iinfo(np.int64).max


class Chunk:
    """One engine's planned completions: part `part` of the index (see Pending.cut)."""

    __slots__ = ("part",)

    def __init__(self, part: int) -> None:
        self.part = part


class Pending:
    def __init__(self) -> None:
        self._times = np.empty(0)
        self._sids = self._versions = self._parts = self._ranks = EMPTY
        self._cursor = 0  # entries before it are delivered
        self._limit = np.empty(0, np.int64)  # [part]: its entries of rank >= limit are cut
        self._parts_used = 0
        self._cuts = 0  # entries cut since the last compaction (an upper bound)
        self._live: tuple[np.ndarray, np.ndarray] | None = None  # undelivered, uncut: (times, versions)
        self._next = float("inf")  # nothing is due before then (the controller looks often)

    def _new_parts(self, n: int) -> int:
        first = self._parts_used
        self._parts_used += n
        if self._parts_used > len(self._limit):
            grown = np.full(max(2 * len(self._limit), self._parts_used, 64), NO_LIMIT, np.int64)
            grown[:len(self._limit)] = self._limit
            self._limit = grown
        return first

    def add(self, times: np.ndarray, sids: np.ndarray, versions: np.ndarray) -> Chunk:
        """One engine's completions, times ascending: one part."""
        part = self._new_parts(1)
        self._merge(times, sids, versions, np.full(len(times), part, np.int64), np.arange(len(times)), ordered=True)
        return Chunk(part)

    def add_parts(self, times: np.ndarray, sids: np.ndarray, versions: np.ndarray, owner: np.ndarray,
                  ranks: np.ndarray, n: int) -> int:
        """Completions of n engines at once: entry i is number ranks[i] of part owner[i] (0..n-1).
        Returns the first part's id (the others follow)."""
        first = self._new_parts(n)
        self._merge(times, sids, versions, owner + first, ranks, ordered=False)
        return first

    def _merge(self, times: np.ndarray, sids: np.ndarray, versions: np.ndarray, parts: np.ndarray,
               ranks: np.ndarray, ordered: bool) -> None:
        if not len(times):
            return
        if not ordered:
            # the order among equal times does not matter: the buffer sorts what it takes by sample id
            order = np.argsort(times)
            times, sids, versions, parts, ranks = times[order], sids[order], versions[order], parts[order], ranks[order]
        self._compact()
        c = self._cursor
        # after every entry already filed at the same time: a stable sort of everything, in filing order
        at = c + np.searchsorted(self._times[c:], times, "right")
        self._times = np.insert(self._times, at, times)
        self._sids = np.insert(self._sids, at, sids)
        self._versions = np.insert(self._versions, at, versions)
        self._parts = np.insert(self._parts, at, parts)
        self._ranks = np.insert(self._ranks, at, ranks)
        self._live = None
        self._next = min(self._next, float(times[0]))

    def cut(self, chunk: Chunk, keep: int) -> None:
        """The plan behind `chunk` stopped early: only its first `keep` completions happen (those
        cut off were due after now, so none of them has been delivered)."""
        self.cut_parts(np.array([chunk.part]), np.array([keep]))

    def cut_parts(self, parts: np.ndarray, keep: np.ndarray) -> None:
        """`cut` for many parts at once."""
        limit = self._limit[parts]
        keep = np.minimum(limit, keep)
        if (keep < limit).any():
            self._limit[parts] = keep
            self._cuts += 1
            self._live = None

    def _compact(self) -> None:
        """Drop the delivered prefix and cut entries once they are a good part of the index."""
        c = self._cursor
        if not (2 * c > len(self._times) or self._cuts > 32):
            return
        keep = self._ranks[c:] < self._limit[self._parts[c:]]
        self._times, self._sids, self._versions = self._times[c:][keep], self._sids[c:][keep], self._versions[c:][keep]
        self._parts, self._ranks = self._parts[c:][keep], self._ranks[c:][keep]
        self._cursor, self._cuts = 0, 0

    def due(self, now: float) -> tuple[np.ndarray, np.ndarray]:
        """Take out the completions at or before `now`: (sample ids, start versions)."""
        if now < self._next:
            return EMPTY, EMPTY
        lo = self._cursor
        hi = lo + int(self._times[lo:].searchsorted(now, "right"))
        self._cursor = hi
        self._next = float(self._times[hi]) if hi < len(self._times) else float("inf")
        if hi <= lo:
            return EMPTY, EMPTY
        self._live = None
        valid = self._ranks[lo:hi] < self._limit[self._parts[lo:hi]]
        if valid.all():
            return self._sids[lo:hi], self._versions[lo:hi]
        return self._sids[lo:hi][valid], self._versions[lo:hi][valid]

    def _remaining(self) -> tuple[np.ndarray, np.ndarray]:
        if self._live is None:
            c = self._cursor
            valid = self._ranks[c:] < self._limit[self._parts[c:]]
            self._live = (self._times[c:][valid], self._versions[c:][valid])
        return self._live

    def kth_time(self, need: dict[int, int]) -> float:
        """Earliest time by which, for every level L in `need`, need[L] more completions of start
        version <= L are in (inf if the plans never get there); the next completion if `need` is empty."""
        times, versions = self._remaining()
        if not len(times):
            return float("inf")
        if not need:
            return float(times[0])
        out = -float("inf")
        for level, n in need.items():
            at = np.flatnonzero(versions <= level)
            if len(at) < n:
                return float("inf")
            out = max(out, float(times[at[n - 1]]))
        return out
