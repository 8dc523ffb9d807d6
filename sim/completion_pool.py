"""Completions that engines' decode plans will make, filed ahead, not yet in the trainer's buffer.

An engine decoding a fixed batch knows when each of its samples will finish; it files them here
instead of one simulation event per sample. Every filing is a set of "parts" (one per decode plan:
a whole fleet of engines laying out together files one part each in one call), and a part is cut
back when its decode plan is interrupted: only its first `keep` completions happen.

All undelivered completions live in one unsorted pool: a filing is appended (no sort, no merge),
and a cut only lowers its part's limit: entries past the limit are skipped when read. Only two
questions are asked of the pool, which completions are due by now (a comparison over the pool) and
when the n-th completion of some start versions will be in (a partial sort, `np.partition`), and
neither answer depends on the pool's order: the buffer sorts what it takes by sample id. Delivered
entries are marked (their time set to infinity) and dropped, with cut ones, at the next compaction.
"""

from __future__ import annotations

import numpy as np

from sim.decode_plans import EMPTY, FlatDecodePlans
from sim.kernels.pool import compact_pool, file_entries, file_plan_rows, take_due

NO_LIMIT = np.iinfo(np.int64).max


class CompletionPool:
    """Completions filed ahead (in parts, one per decode plan), cut back, and taken out when due."""

    def __init__(self, start_version: np.ndarray) -> None:
        self.start_version = start_version  # [sample id]: the version it started under (set before it is filed)
        # the pool: the first `_n` entries of buffers with room to grow (a filing writes its entries
        # after them, not a copy of the whole pool); `_times` and the others are views of them.
        # Per entry: when (inf once delivered), sample id, start version, part, rank in its part
        self._n = 0
        self._buffers = (np.empty(0), EMPTY, EMPTY, EMPTY, EMPTY)
        self._view()
        self._limit = np.empty(0, np.int64)  # [part]: its entries of rank >= limit are cut
        self._parts_used = 0
        self._delivered = 0  # entries delivered since the last compaction
        self._cuts = 0  # cuts since the last compaction
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

    def file(self, times: np.ndarray, sids: np.ndarray) -> int:
        """One engine's completions: one part (its id is returned)."""
        part = self._new_parts(1)
        at = self._room_for(len(times))
        if at is None:
            return part
        if len(times) == 1:  # a busy small fleet's usual filing: file_entries' one entry, without the kernel's call
            t, sid = float(times[0]), int(sids[0])
            times_buf, sid_buf, version_buf, part_buf, rank_buf = self._buffers
            times_buf[at], sid_buf[at], version_buf[at], part_buf[at], rank_buf[at] = (
                t, sid, self.start_version[sid], part, 0)
            self._filed(at, 1, t)
        else:  # `_file` for one part
            self._filed(at, len(times), file_entries(*self._buffers, at, times, sids, self.start_version, part,
                                                     EMPTY, EMPTY))
        return part

    def file_parts(self, times: np.ndarray, sids: np.ndarray, owner: np.ndarray, ranks: np.ndarray, n: int) -> int:
        """Completions of n engines at once: entry i is number ranks[i] of part owner[i] (0..n-1).
        Returns the first part's id (the others follow)."""
        first = self._new_parts(n)
        self._file(times, sids, first, owner, ranks)
        return first

    def file_plans(self, plans: FlatDecodePlans, reward: np.ndarray) -> int:
        """What n engines' decode plans complete (each engine's first rows, in jump order, at its jump's end
        plus reward[e]): part e of the n is engine e's. Returns the first part's id."""
        first = self._new_parts(len(plans.n_done))
        k = int(plans.n_done.sum())
        at = self._room_for(k)
        if at is not None:
            self._filed(at, k, file_plan_rows(
                *self._buffers, at, plans.rows, plans.jumps, plans.done, plans.ends, plans.sid,
                np.asarray(reward, np.float64), self.start_version, first))
        return first

    def _file(self, times: np.ndarray, sids: np.ndarray, first_part: int, owner: np.ndarray, ranks: np.ndarray
              ) -> None:
        """Entry i is number ranks[i] of part first_part + owner[i] (no owner: all of one part, in order)."""
        at = self._room_for(len(times))
        if at is not None:
            self._filed(at, len(times), file_entries(
                *self._buffers, at, np.asarray(times, np.float64), np.asarray(sids, np.int64), self.start_version,
                first_part, np.asarray(owner, np.int64), np.asarray(ranks, np.int64)))

    def _room_for(self, k: int) -> int | None:
        """Where k new entries go (the pool compacted and grown as needed); None for no entries."""
        if not k:
            return None
        self._compact()
        n = self._n
        if n + k > len(self._buffers[0]):  # twice the room
            room = max(2 * len(self._buffers[0]), n + k, 1024)
            grown = tuple(np.empty(room, b.dtype) for b in self._buffers)
            for old, new in zip(self._buffers, grown, strict=True):
                new[:n] = old[:n]
            self._buffers = grown
        return n

    def _filed(self, at: int, k: int, earliest: float) -> None:
        self._n = at + k
        self._stale = True  # the column views are re-sliced when next read (`_view`), not at every filing
        self._live = None
        self._next = min(self._next, earliest)

    def cut(self, part: int, keep: int) -> None:
        """The decode plan behind `part` stopped early: only its first `keep` completions happen (those
        cut off were due after now, so none of them has been delivered). One engine's plan, cut at
        every interrupt: no arrays for one number."""
        if keep < self._limit[part]:
            self._limit[part] = keep
            self._cuts += 1
            self._live = None

    def cut_parts(self, parts: np.ndarray, keep: np.ndarray) -> None:
        """`cut` for many parts at once."""
        limit = self._limit[parts]
        keep = np.minimum(limit, keep)
        if (keep < limit).any():
            self._limit[parts] = keep
            self._cuts += 1
            self._live = None

    def _compact(self, force: bool = False) -> None:
        """Drop delivered and cut entries once they are a good part of the pool (or now: `force`)."""
        if not (force or 2 * self._delivered > self._n or self._cuts > 32):
            return
        if not (self._delivered or self._cuts):  # nothing delivered or cut since the last one: all entries live
            return
        self._n = compact_pool(*self._columns(), self._limit)  # in place: the views write to the buffers
        self._view()
        self._delivered, self._cuts = 0, 0

    def _columns(self) -> tuple[np.ndarray, ...]:
        if self._stale:
            self._view()
        return self._times, self._sids, self._versions, self._parts, self._ranks

    def _view(self) -> None:
        """Point the column names at the pool's entries."""
        self._stale = False
        n, (times, sids, versions, parts, ranks) = self._n, self._buffers
        self._times, self._sids, self._versions, self._parts, self._ranks = (
            times[:n], sids[:n], versions[:n], parts[:n], ranks[:n])

    def due(self, now: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Take out the completions at or before `now`: their sample ids grouped by start version
        (ascending; in no order within a version), the versions, and how many of each."""
        if now < self._next:
            return EMPTY, EMPTY, EMPTY
        sids, levels, counts, n_hit, self._next = take_due(*self._columns(), self._limit, now)
        self._delivered += n_hit
        self._live = None
        return sids, levels, counts

    def _remaining(self) -> tuple[np.ndarray, np.ndarray]:
        """Times and start versions of the entries still to come (views of the pool, compacted to
        them: the pass that finds them drops the rest, so later passes are shorter)."""
        if self._live is None:
            self._compact(force=True)
            times, _, versions, _, _ = self._columns()  # fresh views, compacted or not
            self._live = (times, versions)
        return self._live

    def kth_time(self, need: dict[int, int]) -> float:
        """Earliest time by which, for every level L in `need`, need[L] more completions of start
        version <= L are in (inf if the decode plans never get there); the next completion if `need` is empty."""
        times, versions = self._remaining()
        if not len(times):
            return float("inf")
        if not need:
            return float(times.min())
        out, newest = -float("inf"), int(versions.max())  # the newest start version: once, not per level
        for level, n in need.items():
            mine = times if level >= newest else times[versions <= level]
            if len(mine) < n:
                return float("inf")
            # the n-th smallest, ties or not (the first: the minimum, without a partition's copy)
            out = max(out, float(mine.min() if n == 1 else np.partition(mine, n - 1)[n - 1]))
        return out
