"""Completions that engines have planned ahead but that have not reached the trainer's buffer yet.

An engine decoding a fixed batch knows when each of its samples will finish; it files them here as
one chunk (sorted times, sample ids) instead of one simulation event per sample. A chunk is cut back
when the plan is interrupted. The controller delivers what is due whenever it looks at its buffer,
and asks `kth_time` when enough of them will be in for the trainer's next step. Both read one index
of every undelivered completion by time, rebuilt only after plans change (a few times a step).
"""

from __future__ import annotations

import numpy as np

EMPTY = np.empty(0, np.int64)


class Chunk:
    """Planned completions of one engine, by time; `lo:hi` is what is still to be delivered (`lo` is
    brought up to date when the index is rebuilt)."""

    __slots__ = ("hi", "lo", "sids", "times", "versions")

    def __init__(self, times: np.ndarray, sids: np.ndarray, versions: np.ndarray) -> None:
        self.times, self.sids, self.versions = times, sids, versions
        self.lo, self.hi = 0, len(times)


class Pending:
    def __init__(self) -> None:
        self.chunks: list[Chunk] = []
        self._stale = True  # plans changed since the index was built
        self._indexed: list[Chunk] = []  # the chunks the index holds, in `owner` numbering
        self._times = self._sids = self._versions = self._owner = EMPTY
        self._cursor = 0  # the index's items before it are delivered
        self._next = float("inf")  # nothing is due before then (the controller looks often)

    def add(self, times: np.ndarray, sids: np.ndarray, versions: np.ndarray) -> Chunk:
        chunk = Chunk(times, sids, versions)
        if chunk.hi:
            self.chunks.append(chunk)
            self._stale = True
            self._next = min(self._next, float(times[0]))
        return chunk

    def cut(self, chunk: Chunk, keep: int) -> None:
        """The plan behind `chunk` stopped early: only its first `keep` completions happen (those
        cut off were due after now, so none of them has been delivered)."""
        if keep < chunk.hi:
            chunk.hi = keep
            self._stale = True

    def _index(self) -> None:
        """Every undelivered completion, by time (stable: a chunk's own stay in order)."""
        if not self._stale:
            return
        delivered = np.bincount(self._owner[:self._cursor], minlength=len(self._indexed))
        for i in np.flatnonzero(delivered).tolist():
            self._indexed[i].lo += int(delivered[i])
        live = [ch for ch in self.chunks if ch.lo < ch.hi]
        self.chunks, self._indexed, self._cursor, self._stale = live, live, 0, False
        if not live:
            self._times = self._sids = self._versions = self._owner = EMPTY
            self._next = float("inf")
            return
        times = np.concatenate([ch.times[ch.lo:ch.hi] for ch in live])
        order = np.argsort(times, kind="stable")
        self._times = times[order]
        self._sids = np.concatenate([ch.sids[ch.lo:ch.hi] for ch in live])[order]
        self._versions = np.concatenate([ch.versions[ch.lo:ch.hi] for ch in live])[order]
        self._owner = np.repeat(np.arange(len(live)), [ch.hi - ch.lo for ch in live])[order]
        self._next = float(self._times[0])

    def due(self, now: float) -> tuple[np.ndarray, np.ndarray]:
        """Take out the completions at or before `now`: (sample ids, start versions)."""
        if now < self._next:
            return EMPTY, EMPTY
        self._index()
        lo = self._cursor
        hi = int(self._times.searchsorted(now, "right"))
        self._cursor = max(lo, hi)
        self._next = float(self._times[self._cursor]) if self._cursor < len(self._times) else float("inf")
        if hi <= lo:
            return EMPTY, EMPTY
        return self._sids[lo:hi], self._versions[lo:hi]

    def kth_time(self, need: dict[int, int]) -> float:
        """Earliest time by which, for every level L in `need`, need[L] more completions of start
        version <= L are in (inf if the plans never get there); the next completion if `need` is empty."""
        self._index()
        times, versions = self._times[self._cursor:], self._versions[self._cursor:]
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
