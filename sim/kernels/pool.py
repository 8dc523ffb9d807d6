"""Filing completions into the completion pool's buffers, taking those due, compacting
(sim.completion_pool.CompletionPool)."""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def file_entries(times_buf: np.ndarray, sid_buf: np.ndarray, version_buf: np.ndarray, part_buf: np.ndarray,
                 rank_buf: np.ndarray, at: int, times: np.ndarray, sids: np.ndarray, start_version: np.ndarray,
                 first_part: int, owner: np.ndarray, ranks: np.ndarray) -> float:
    """sim.completion_pool.CompletionPool's filing: entries written into the pool's buffers from `at` on, entry i
    (sample sids[i], start version start_version[sids[i]]) number ranks[i] of part
    first_part + owner[i] (empty owner: all of part first_part, ranked in order). Returns the
    earliest time filed."""
    one_part = len(owner) == 0
    earliest = np.inf
    for i in range(len(times)):
        q = at + i
        times_buf[q], sid_buf[q], version_buf[q] = times[i], sids[i], start_version[sids[i]]
        part_buf[q] = first_part if one_part else first_part + owner[i]
        rank_buf[q] = i if one_part else ranks[i]
        earliest = min(earliest, times[i])
    return earliest


@njit(cache=True)
def file_plan_rows(times_buf: np.ndarray, sid_buf: np.ndarray, version_buf: np.ndarray, part_buf: np.ndarray,
               rank_buf: np.ndarray, at: int, rows: np.ndarray, jumps: np.ndarray, done: np.ndarray, ends: np.ndarray,
               sid: np.ndarray, reward: np.ndarray, start_version: np.ndarray, first_part: int) -> float:
    """`file_entries` for what n engines' decode plans complete (sim.decode_plans.FlatDecodePlans: engine e's first
    rows, in jump order, each at its jump's end plus the engine's reward latency), as part
    first_part + e, ranked in order. Returns the earliest time filed."""
    earliest = np.inf
    q = at
    for e in range(len(rows) - 1):
        r = rows[e]
        for j in range(jumps[e], jumps[e + 1]):
            t = ends[j] + reward[e]
            for _ in range(done[j]):
                times_buf[q], sid_buf[q], version_buf[q] = t, sid[r], start_version[sid[r]]
                part_buf[q], rank_buf[q] = first_part + e, r - rows[e]
                earliest = min(earliest, t)
                q += 1
                r += 1
    return earliest


@njit(cache=True)
def take_due(times: np.ndarray, sids: np.ndarray, versions: np.ndarray, parts: np.ndarray, ranks: np.ndarray,
             limit: np.ndarray, now: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, float]:
    """sim.completion_pool.CompletionPool.due's pass over the pool: entries due by `now` are marked delivered
    (time set to infinity). Returns the sample ids of those not cut off (rank below their part's
    limit) grouped by start version (a counting sort), the versions and how many of each; how many
    entries were marked, and the earliest time left."""
    hit = np.empty(len(times), np.int64)
    n_hit, n_valid, nxt = 0, 0, np.inf
    low, high = np.iinfo(np.int64).max, np.iinfo(np.int64).min
    for i in range(len(times)):
        t = times[i]
        if t <= now:
            times[i] = np.inf
            n_hit += 1
            if ranks[i] < limit[parts[i]]:
                hit[n_valid] = i
                n_valid += 1
                low, high = min(low, versions[i]), max(high, versions[i])
        elif t < nxt:
            nxt = t
    if n_valid == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64), n_hit, nxt
    first = np.zeros(high - low + 2, np.int64)
    for q in range(n_valid):
        first[versions[hit[q]] - low + 1] += 1
    levels, counts = np.empty(high - low + 1, np.int64), np.empty(high - low + 1, np.int64)
    m = 0
    for v in range(high - low + 1):
        if first[v + 1]:
            levels[m], counts[m] = low + v, first[v + 1]
            m += 1
        first[v + 1] += first[v]
    out = np.empty(n_valid, np.int64)
    for q in range(n_valid):
        i = hit[q]
        out[first[versions[i] - low]] = sids[i]
        first[versions[i] - low] += 1
    return out, levels[:m], counts[:m], n_hit, nxt


@njit(cache=True)
def compact_pool(times: np.ndarray, sids: np.ndarray, versions: np.ndarray, parts: np.ndarray, ranks: np.ndarray,
                 limit: np.ndarray) -> int:
    """sim.completion_pool.CompletionPool's compaction: entries delivered (time infinite) or cut off (rank at or
    past their part's limit) dropped, the others moved to the front in order; returns how many."""
    m = 0
    for i in range(len(times)):
        if times[i] < np.inf and ranks[i] < limit[parts[i]]:
            times[m], sids[m], versions[m], parts[m], ranks[m] = times[i], sids[i], versions[i], parts[i], ranks[i]
            m += 1
    return m
