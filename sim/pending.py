"""Completions that engines have planned ahead but that have not reached the trainer's buffer yet.

An engine decoding a fixed batch knows when each of its samples will finish; it files them here as
one chunk (sorted times, sample ids) instead of one simulation event per sample. A chunk is cut back
when the plan is interrupted. The controller delivers what is due whenever it looks at its buffer,
and asks `kth_time` when enough of them will be in for the trainer's next step.
"""

from __future__ import annotations

import numpy as np

EMPTY = np.empty(0, np.int64)


class Chunk:
    """Planned completions of one engine, by time; `lo:hi` is what is still to be delivered."""

    __slots__ = ("hi", "lo", "sids", "times", "versions")

    def __init__(self, times: np.ndarray, sids: np.ndarray, versions: np.ndarray) -> None:
        self.times, self.sids, self.versions = times, sids, versions
        self.lo, self.hi = 0, len(times)


class Pending:
    def __init__(self) -> None:
        self.chunks: list[Chunk] = []
        self.changed = False  # since the last `kth_time`
        self._next = float("inf")  # nothing is due before then (the controller looks often)

    def add(self, times: np.ndarray, sids: np.ndarray, versions: np.ndarray) -> Chunk:
        chunk = Chunk(times, sids, versions)
        if chunk.hi:
            self.chunks.append(chunk)
            self.changed = True
            self._next = min(self._next, float(times[0]))
        return chunk

    def cut(self, chunk: Chunk, keep: int) -> None:
        """The plan behind `chunk` stopped early: only its first `keep` completions happen."""
        if keep < chunk.hi:
            chunk.hi = max(keep, chunk.lo)
            self.changed = True

    def due(self, now: float) -> tuple[np.ndarray, np.ndarray]:
        """Take out the completions at or before `now`: (sample ids, start versions)."""
        if now < self._next:
            return EMPTY, EMPTY
        sids, versions, live = [], [], []
        upcoming = float("inf")
        for ch in self.chunks:
            if ch.lo >= ch.hi:
                continue  # delivered, or cut back to nothing
            times = ch.times
            n = ch.hi if times[ch.hi - 1] <= now else min(ch.hi, int(times.searchsorted(now, "right")))
            if n > ch.lo:
                sids.append(ch.sids[ch.lo:n])
                versions.append(ch.versions[ch.lo:n])
                ch.lo = n
            if ch.lo < ch.hi:
                live.append(ch)
                upcoming = min(upcoming, times[ch.lo])
        self.chunks, self._next = live, float(upcoming)
        if not sids:
            return EMPTY, EMPTY
        return np.concatenate(sids), np.concatenate(versions)

    def kth_time(self, need: dict[int, int]) -> float:
        """Earliest time by which, for every level L in `need`, need[L] more completions of start
        version <= L are in (inf if the plans never get there); the next completion if `need` is empty."""
        self.changed = False
        live = [ch for ch in self.chunks if ch.lo < ch.hi]
        if not live:
            return float("inf")
        times = np.concatenate([ch.times[ch.lo:ch.hi] for ch in live])
        if not need:
            return float(times.min())
        versions = np.concatenate([ch.versions[ch.lo:ch.hi] for ch in live])
        out = -float("inf")
        for level, n in need.items():
            t = times[versions <= level]
            if len(t) < n:
                return float("inf")
            out = max(out, float(np.partition(t, n - 1)[n - 1]))
        return out
