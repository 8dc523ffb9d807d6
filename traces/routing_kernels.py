"""The routing policy's compiled passes (traces.routing): a few samples by argmin, many by water-filling."""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def route_few(n: int, accepting: np.ndarray, loads: np.ndarray, caps: np.ndarray, keys: np.ndarray,
              row: np.ndarray, few: int) -> tuple[np.ndarray, bool]:
    """traces.routing.water_fill when at most `few` samples can be placed (a completion freed a slot
    or two): each in turn to the accepting engine with the smallest (keys[row[e], load + 1], e)
    that has room, as the one-at-a-time heap would (keys rising with load). Returns the engines
    and True; or nothing and False when more than `few` would be placed (the caller water-fills)."""
    width = keys.shape[1]
    loads = loads.copy()
    room = 0
    for e in range(len(loads)):
        if accepting[e] and loads[e] < caps[e]:
            room += caps[e] - loads[e]
    if min(n, room) > few:
        return np.empty(0, np.int64), False
    key = np.empty(len(loads))
    for e in range(len(loads)):
        free = accepting[e] and loads[e] < caps[e] and loads[e] + 1 < width
        key[e] = keys[row[e], loads[e] + 1] if free else np.inf
    out = np.empty(min(n, room), np.int64)
    for m in range(len(out)):
        e = np.argmin(key)  # the first of equal keys: the lowest engine
        if key[e] == np.inf:  # no room left anywhere
            return out[:m], True
        out[m] = e
        loads[e] += 1
        key[e] = keys[row[e], loads[e] + 1] if loads[e] < caps[e] and loads[e] + 1 < width else np.inf
    return out, True


@njit(cache=True)
def _slots_below(v: int, loads: np.ndarray, caps: np.ndarray, row: np.ndarray, below: np.ndarray,
                 out: np.ndarray) -> int:
    """Per engine, its free slots whose key is <= the v-th key value (into out); their sum."""
    total = 0
    for e in range(len(loads)):
        out[e] = max(min(below[row[e], v], caps[e]) - loads[e], 0)
        total += out[e]
    return total


@njit(cache=True)
def water_fill_kernel(n: int, loads: np.ndarray, caps: np.ndarray, row: np.ndarray, n_values: int,
                      rank: np.ndarray, below: np.ndarray) -> np.ndarray:
    """traces.routing.water_fill on its key table (traces.routing.key_table: n_values distinct
    finite keys, each slot key's rank among them, `below`): a bisection for the smallest key value
    whose slots cover n, then those slots by (key, engine, load), a counting sort on the key's
    rank over slots laid out by (engine, load)."""
    take = np.empty(len(loads), np.int64)
    lo, hi = 0, n_values - 1
    if _slots_below(hi, loads, caps, row, below, take) > n:
        while lo < hi:  # smallest key value whose slots cover n
            mid = (lo + hi) // 2
            if _slots_below(mid, loads, caps, row, below, take) >= n:
                hi = mid
            else:
                lo = mid + 1
    _slots_below(hi, loads, caps, row, below, take)
    first = np.zeros(n_values + 2, np.int64)  # per key rank (n_values: an infinite key), then prefix sums
    for e in range(len(loads)):
        for level in range(loads[e], loads[e] + take[e]):
            first[rank[row[e], level + 1] + 1] += 1
    for r in range(n_values + 1):
        first[r + 1] += first[r]
    out = np.empty(first[n_values + 1], np.int64)
    for e in range(len(loads)):
        for level in range(loads[e], loads[e] + take[e]):
            r = rank[row[e], level + 1]
            out[first[r]] = e
            first[r] += 1
    return out[:n]
