"""Closed-form sums of decode iterations on a decode table's cells, and where a jump in progress stops
(sim.decode_tables.DecodeTable, DecodeStack)."""

from __future__ import annotations

import math

import numpy as np
from numba import njit


@njit(cache=True)
def jump_total(base: np.ndarray, slope: np.ndarray, ds: float, b: int, s0: float, k: int) -> float:
    """sim.decode_tables.DecodeTable.total on the table's arrays: sum_{j<k} t(b, s0 + b j), cell by cell
    of the context grid (linear within a cell: an arithmetic series)."""
    if k <= 0:
        return 0.0
    last = base.shape[1] - 1  # the last cell extends to infinity
    out = 0.0
    j = 0
    while j < k:
        c = int((s0 + b * j) / ds)
        if c >= last:
            c = last
            j_end = k
        else:
            c = max(c, 0)
            j_end = min(k, max(j + 1, math.ceil(((c + 1) * ds - s0) / b)))
        n = j_end - j
        sl = slope[b, c]
        out += n * (base[b, c] + sl * s0) + sl * b * (j + j_end - 1) * n / 2
        j = j_end
    return out


@njit(cache=True)
def jump_totals(base: np.ndarray, slope: np.ndarray, ds: float, b: np.ndarray, s0: np.ndarray, k: np.ndarray
                ) -> np.ndarray:
    """`jump_total` of every jump."""
    out = np.empty(len(k))
    for i in range(len(k)):
        out[i] = jump_total(base, slope, ds, b[i], s0[i], k[i])
    return out


@njit(cache=True)
def _iterations_within(base: np.ndarray, slope: np.ndarray, ds: float, b: int, s0: float, k: int, seconds: float
                       ) -> int:
    """The largest count w <= k of iterations whose sum fits in `seconds` (to 1e-12): guessed from
    the first grid cell's arithmetic series (a quadratic in w), then the guess's neighbours are
    checked, then a bisection if the jump crossed cells. Sums grow with w, so the answer is the
    same whatever the guess."""
    limit = seconds + 1e-12
    c = min(max(int(s0 / ds), 0), base.shape[1] - 1)
    per = base[b, c] + slope[b, c] * s0  # the first iteration's seconds
    a = slope[b, c] * b / 2
    guess = seconds / per if per > 0 else 0.0
    if a > 0:
        guess = (math.sqrt((per - a) ** 2 + 4 * a * seconds) - (per - a)) / (2 * a)
    w = int(min(max(math.floor(guess), 0), k)) if math.isfinite(guess) else 0
    lo, hi = 0, k  # the answer lies in [lo, hi]
    for _ in range(2):  # the guess and its neighbours first
        if jump_total(base, slope, ds, b, s0, w) <= limit:
            lo = w
            if w == k or jump_total(base, slope, ds, b, s0, w + 1) > limit:
                return w
            w += 1
        else:
            hi = w - 1
            w -= 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if jump_total(base, slope, ds, b, s0, mid) <= limit:
            lo = mid
        else:
            hi = mid - 1
    return lo


@njit(cache=True)
def stop_one(base: np.ndarray, slope: np.ndarray, ds: float, b: int, s0: float, k: int, elapsed: float
              ) -> tuple[int, float]:
    """A jump in progress `elapsed` seconds after it started, stopped after its current iteration
    (one that started at `elapsed` runs one iteration): (iterations run, seconds left until then)."""
    within = _iterations_within(base, slope, ds, b, s0, k, elapsed)
    d = within
    if within == 0 or jump_total(base, slope, ds, b, s0, within) < elapsed - 1e-12:
        d = within + 1  # the iteration in progress runs to its end
    d = min(k, d)
    return d, jump_total(base, slope, ds, b, s0, d) - elapsed


@njit(cache=True)
def stop_after(base: np.ndarray, slope: np.ndarray, ds: np.ndarray, table: np.ndarray, b: np.ndarray, s0: np.ndarray,
               k: np.ndarray, elapsed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """sim.decode_tables.DecodeTable.stop_after (`stop_one` of every jump). Jump i's table is t = table[i]
    of a stack (base[t], slope[t], ds[t]; sim.decode_tables.DecodeStack)."""
    n = len(k)
    done, rest = np.empty(n, np.int64), np.empty(n)
    for i in range(n):
        t = table[i]
        done[i], rest[i] = stop_one(base[t], slope[t], ds[t], b[i], s0[i], k[i], elapsed[i])
    return done, rest
