"""Decode plans of many engines at once, and of one engine to its first completion (sim.decode_plans)."""

from __future__ import annotations

import numpy as np
from numba import njit

from sim.kernels.decode_sums import jump_total
from sim.kernels.owners import bounds_by_owner


@njit(cache=True)
def _bit_length(x: int) -> int:
    n = 0
    while x > 0:
        x >>= 1
        n += 1
    return n


@njit(cache=True)
def engine_keys(eng: np.ndarray, fin: np.ndarray, sid: np.ndarray, progress: np.ndarray) -> tuple[np.ndarray, int]:
    """Sort keys for sim.decode_plans.flat_decode_plans's order by (engine, finish, sid): per row the three
    packed in one integer (finish relative to its engine's progress), with the row's index in the
    low `bits` bits. Keys are distinct (sample ids are), so any sort of them gives that order and
    carries the permutation. bits = -1: they do not fit in 63 bits (the caller lexsorts)."""
    n = len(eng)
    sid_max = rel_max = eng_max = 0
    negative = False
    for r in range(n):
        rel = fin[r] - progress[eng[r]]  # >= 0: a running sample finishes at or after its engine's progress
        negative |= rel < 0 or sid[r] < 0
        sid_max, rel_max, eng_max = max(sid_max, sid[r]), max(rel_max, rel), max(eng_max, eng[r])
    sid_bits, rel_bits = _bit_length(sid_max), _bit_length(rel_max)
    idx_bits = _bit_length(n - 1)
    keys = np.empty(n, np.int64)
    if negative or sid_bits + rel_bits + _bit_length(eng_max) + idx_bits > 62:
        return keys, -1
    for r in range(n):
        rel = fin[r] - progress[eng[r]]
        keys[r] = (((eng[r] << rel_bits | rel) << sid_bits | sid[r]) << idx_bits) | r
    return keys, idx_bits


@njit(cache=True)
def plan_sorted(order: np.ndarray, eng: np.ndarray, sid: np.ndarray, fin: np.ndarray, joined: np.ndarray,
                exit_tokens: np.ndarray, progress: np.ndarray, context: np.ndarray, kv: np.ndarray, stop: np.ndarray,
                t0: np.ndarray, base: np.ndarray, slope: np.ndarray, ds: np.ndarray, table: np.ndarray
                ) -> tuple[np.ndarray, ...]:
    """sim.decode_plans.flat_decode_plans once its rows' order by (engine, finish, sid) is known: the rows in
    that order, and each engine's jumps, one per distinct finishing point, b running for k
    iterations from total context s, kept while the KV cache holds (only the first when the engine
    stops at its first completion; a first jump that overflows runs alone up to the overflow).
    Each jump's seconds are `jump_total` on its engine's table (base[t], slope[t], ds[t] with
    t = table[engine]), and its clock a sequential sum from the engine's t0, as chained timeouts
    would give. Returns the fields of sim.decode_plans.FlatDecodePlans, in its order, but `order`."""
    n_rows, n_eng = len(order), len(progress)
    rows = bounds_by_owner(eng, n_eng)
    o_sid, o_fin, o_joined = np.empty(n_rows, np.int64), np.empty(n_rows, np.int64), np.empty(n_rows, np.int64)
    for r in range(n_rows):
        q = order[r]
        o_sid[r], o_fin[r], o_joined[r] = sid[q], fin[q], joined[q]
    jumps = np.zeros(n_eng + 1, np.int64)
    b, k, done = np.empty(n_rows, np.int64), np.empty(n_rows, np.int64), np.empty(n_rows, np.int64)
    s, ends, starts, after = np.empty(n_rows), np.empty(n_rows), np.empty(n_rows), np.empty(n_rows)
    cum, k_through = np.empty(n_rows, np.int64), np.empty(n_rows, np.int64)
    offsets = np.empty(n_eng, np.int64)
    n = 0  # kept jumps so far
    completed = 0  # samples completed by them
    for e in range(n_eng):
        offsets[e] = completed
        r, end = rows[e], rows[e + 1]
        left, grown, prev, rank, overflowed = end - r, 0, progress[e], 0, False
        iterations = 0
        while r < end and not overflowed and not (stop[e] and rank == 1):
            f = o_fin[r]
            q, fr = r, 0
            while q < end and o_fin[q] == f:
                fr += exit_tokens[o_sid[q]]
                q += 1
            kk = f - prev
            ss = context[e] + float(grown)  # integers below 2^53: exact
            if not kv[e] - ss >= left * kk:  # the cache would overflow during this jump
                if rank > 0:
                    break
                room = (kv[e] - ss) // left  # iterations the cache still holds
                k0 = max(1, min(kk, int(room))) if room >= 1 else 1
                if k0 != kk:
                    q, fr = r, 0  # it stops before its completions
                kk, overflowed = k0, True
            b[n], s[n], k[n], done[n] = left, ss, kk, q - r
            after[n] = ss + (left * kk - fr)
            iterations += kk
            k_through[n] = iterations
            completed += q - r
            cum[n] = completed
            n += 1
            grown += left * kk - fr
            left -= q - r
            prev, rank, r = f, rank + 1, q
        jumps[e + 1] = n
    # the clocks in a pass of their own (the loop above is long enough as it is: compiled into it,
    # the sums ran half as fast)
    n_done = np.zeros(n_eng, np.int64)
    for e in range(n_eng):
        t = table[e]
        base_t, slope_t, ds_t = base[t], slope[t], ds[t]
        clock = t0[e]
        for j in range(jumps[e], jumps[e + 1]):
            starts[j] = clock
            clock = clock + jump_total(base_t, slope_t, ds_t, b[j], s[j], k[j])
            ends[j] = clock
        n_done[e] = (cum[jumps[e + 1] - 1] if jumps[e + 1] > jumps[e] else offsets[e]) - offsets[e]
    return (rows, o_sid, o_fin, o_joined, jumps, b[:n], s[:n], k[:n], ends[:n], starts[:n], done[:n], after[:n],
            cum[:n], offsets, k_through[:n], n_done)


@njit(cache=True)
def first_jump(sid: np.ndarray, finish: np.ndarray, joined: np.ndarray, progress: int, context: float, kv: float,
               exit_tokens: np.ndarray, base: np.ndarray, slope: np.ndarray, ds: float, t0: float,
               rows: np.ndarray, ints: np.ndarray, floats: np.ndarray) -> None:
    """sim.decode_plans.first_jump_plan: one engine's batch sorted by (finish, sid) (an insertion sort:
    a running batch is sorted but for the samples just joined), and its jump to the first
    completion, cut where the KV cache would overflow. Written into the caller's arrays (a kernel
    that returns new arrays pays for boxing each, at every completion of a busy fleet): rows[0:3]
    sorted sid, finish, joined; ints [b, k, completions, completions, k]; floats [context, end,
    KV context after it, t0]."""
    b = len(sid)
    o_sid, o_fin, o_joined = rows[0], rows[1], rows[2]
    o_sid[:], o_fin[:], o_joined[:] = sid, finish, joined
    sid, finish, joined = o_sid, o_fin, o_joined
    for i in range(1, b):
        s, f, j = sid[i], finish[i], joined[i]
        q = i - 1
        while q >= 0 and (finish[q] > f or (finish[q] == f and sid[q] > s)):
            sid[q + 1], finish[q + 1], joined[q + 1] = sid[q], finish[q], joined[q]
            q -= 1
        sid[q + 1], finish[q + 1], joined[q + 1] = s, f, j
    first = finish[0]
    n, freed = 0, 0
    while n < b and finish[n] == first:
        freed += exit_tokens[sid[n]]
        n += 1
    k = first - progress
    room = (kv - context) // b
    if room < k:  # the cache overflows first: stop there
        k0 = max(1, min(k, int(room))) if room >= 1 else 1
        if k0 != k:
            n, freed, k = 0, 0, k0
    end = t0 + jump_total(base, slope, ds, b, context, k)
    ints[0], ints[1], ints[2], ints[3], ints[4] = b, k, n, n, k
    floats[0], floats[1], floats[2], floats[3] = context, end, context + (b * k - freed), t0
