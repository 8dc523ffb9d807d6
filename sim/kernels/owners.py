"""Per-owner counts and groupings of flat rows (entries owned by engines 0..n-1), shared by the other kernels."""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def counts_by_owner(owner: np.ndarray, n: int) -> np.ndarray:
    """How many entries each of n owners has."""
    out = np.zeros(n, np.int64)
    for i in range(len(owner)):
        out[owner[i]] += 1
    return out


@njit(cache=True)
def bounds_by_owner(owner: np.ndarray, n: int) -> np.ndarray:
    """Where each of n owners' entries start once grouped by owner, then their total: [n + 1]."""
    out = np.zeros(n + 1, np.int64)
    out[1:] = np.cumsum(counts_by_owner(owner, n))
    return out


@njit(cache=True)
def group_by_owner(owner: np.ndarray, sid: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Entries (owner[i] in 0..n-1, sid[i]) grouped by owner, each group in its entries' order
    (a stable counting sort)."""
    first = bounds_by_owner(owner, n)
    out_owner, out_sid = np.empty(len(owner), np.int64), np.empty(len(owner), np.int64)
    for i in range(len(owner)):
        q = first[owner[i]]
        out_owner[q], out_sid[q] = owner[i], sid[i]
        first[owner[i]] += 1
    return out_owner, out_sid
