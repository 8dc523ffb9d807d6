"""Stage costs of one plan, tabulated from the cost model so the event loop never calls numpy.

Decode iteration time depends on the running sequences B and their total context S (attention
and KV reads grow with S; see traces.costmodel.roofline.decode_seconds). For each engine type it
is tabulated exactly over B and on a uniform S grid, linear in between. Sums of k consecutive
iterations (S grows by B per iteration) are then closed-form arithmetic series per grid cell.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from sim.kernels import jump_total, jump_totals, prefill_many, prefill_one
from traces import CostModel, GpuType, ModelSpec

GRID_POINTS = 64


@dataclass(frozen=True)
class DecodeTable:
    ds: float  # grid spacing in tokens of total context
    rows: tuple[tuple[float, ...], ...]  # rows[b][g] = seconds of one iteration, b running, S = g*ds
    # on cell g of row b, t = base[b][g] + slope[b][g] * S: precomputed, as the event loop sums
    # iterations at every completion
    base: tuple[tuple[float, ...], ...] = field(init=False, repr=False)
    slope: tuple[tuple[float, ...], ...] = field(init=False, repr=False)
    base_arr: np.ndarray = field(init=False, repr=False, compare=False)  # the same, as arrays [b, cell]
    slope_arr: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # element-wise IEEE arithmetic in the scalar formulas' order, so the same bits as Python floats:
        # slope = (t[c+1] - t[c]) / ds, base = t[c] - slope * c * ds
        rows = np.array(self.rows, np.float64).reshape(len(self.rows), -1)
        cells = np.arange(rows.shape[1] - 1)
        slope_arr = (rows[:, 1:] - rows[:, :-1]) / self.ds
        base_arr = rows[:, :-1] - slope_arr * cells * self.ds
        object.__setattr__(self, "slope", tuple(map(tuple, slope_arr.tolist())))
        object.__setattr__(self, "base", tuple(map(tuple, base_arr.tolist())))
        object.__setattr__(self, "base_arr", base_arr)
        object.__setattr__(self, "slope_arr", slope_arr)

    @classmethod
    def build(
        cls, cm: CostModel, gpu: GpuType, model: ModelSpec, tp: int, max_batch: int, max_context: float
    ) -> DecodeTable:
        ds = max(max_context, 1.0) / (GRID_POINTS - 1)
        b = np.arange(0, max_batch + 1)[:, None]
        s = (np.arange(GRID_POINTS) * ds)[None, :]
        secs = cm.decode(gpu, model, tp, np.maximum(b, 1), s / np.maximum(b, 1)).seconds
        return cls(ds, tuple(map(tuple, np.asarray(secs, np.float64).tolist())))

    def total(self, b: int, s0: float, k: int) -> float:
        """Seconds of k iterations starting at total context s0: sum_{j<k} t(b, s0 + b j)."""
        return jump_total(self.base_arr, self.slope_arr, self.ds, b, s0, k)

    def totals(self, b: np.ndarray, s0: np.ndarray, k: np.ndarray) -> np.ndarray:
        """`total` of many jumps at once, bit for bit: the same arithmetic, compiled (sim.kernels)."""
        b, s0, k = np.asarray(b, np.int64), np.asarray(s0, np.float64), np.asarray(k, np.int64)
        return jump_totals(self.base_arr, self.slope_arr, self.ds, b, s0, k)

    def _bracket(self, b: np.ndarray, s0: np.ndarray, k: np.ndarray, seconds: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
        """Bounds on `iterations_within` from the first and last iteration's times (an iteration
        takes between the two when time grows with context), checked with `totals`: where a check
        fails the bounds are the whole jump, so the bisection's answer is the same either way."""
        first = self.totals(b, s0, np.ones_like(k))
        last = self.totals(b, s0 + b * np.maximum(k - 1, 0), np.ones_like(k))
        with np.errstate(divide="ignore", invalid="ignore"):
            lo = np.clip(np.floor(seconds / np.maximum(first, last)) - 1, 0, k).astype(np.int64)
            hi = np.clip(np.ceil(seconds / np.minimum(first, last)) + 1, 0, k).astype(np.int64)
        hi = np.maximum(lo, hi)
        ok = (self.totals(b, s0, lo) <= seconds + 1e-12) & (
            (hi == k) | (self.totals(b, s0, np.minimum(hi + 1, k)) > seconds + 1e-12))
        return np.where(ok, lo, 0), np.where(ok, hi, k)

    def stop_after(self, b: np.ndarray, s0: np.ndarray, k: np.ndarray, elapsed: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
        """Jumps in progress `elapsed` seconds after they started, stopped after their current
        iteration (one that started at `elapsed` runs one iteration): (iterations run, seconds left).

        `iterations_within` then the rule above, with fewer `totals` calls: the iteration count is
        estimated from the first grid cell's arithmetic series (a quadratic), and the estimate's
        neighbours are summed in one call; where they do not bracket the answer (the jump crossed
        cells), the bisection settles it. Either way the answer is the largest count whose `totals`
        fits, so the bits do not depend on the estimate."""
        k = np.asarray(k, np.int64)
        n = len(k)
        eps = 1e-12
        cell = np.clip((s0 / self.ds).astype(np.int64), 0, GRID_POINTS - 2)
        slope = self.slope_arr[b, cell]
        per = self.base_arr[b, cell] + slope * s0  # the first iteration's seconds
        a = slope * b / 2
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            lin = elapsed / per
            quad = (np.sqrt((per - a) ** 2 + 4 * a * elapsed) - (per - a)) / (2 * a)
            guess = np.where(a > 0, quad, lin)
        guess = np.where(np.isfinite(guess), guess, 0.0)
        est = np.clip(np.floor(guess), 0, k).astype(np.int64)
        offsets = np.arange(-1, 3)
        cand = np.clip(est[None, :] + offsets[:, None], 0, k[None, :])  # [4, n]
        tot = self.totals(np.tile(b, 4), np.tile(s0, 4), cand.ravel()).reshape(4, n)
        fits = tot <= elapsed + eps
        # the largest candidate that fits, if the next count does not (or it is the whole jump)
        within = np.full(n, -1, np.int64)
        for r in range(3):
            ok = fits[r] & ((cand[r] == k) | (~fits[r + 1] & (cand[r + 1] == cand[r] + 1)))
            within = np.where(ok, cand[r], within)
        miss = np.flatnonzero(within < 0)
        if len(miss):
            within[miss] = self.iterations_within(b[miss], s0[miss], k[miss], elapsed[miss])
        t_within = np.full(n, np.nan)
        for r in range(4):
            t_within = np.where(cand[r] == within, tot[r], t_within)
        need = np.isnan(t_within)
        if need.any():
            t_within[need] = self.totals(b[need], s0[need], within[need])
        # the iteration in progress runs to its end
        done = np.where((within == 0) | (t_within < elapsed - eps), within + 1, within)
        done = np.minimum(k, done)
        t_done = np.full(n, np.nan)
        for r in range(4):
            t_done = np.where(cand[r] == done, tot[r], t_done)
        t_done = np.where(done == within, t_within, t_done)
        need = np.isnan(t_done)
        if need.any():
            t_done[need] = self.totals(b[need], s0[need], done[need])
        return done, t_done - elapsed

    def iterations_within(self, b: np.ndarray, s0: np.ndarray, k: np.ndarray, seconds: np.ndarray) -> np.ndarray:
        """Per jump, the iterations (<= k) whose end lies at or before `seconds` after its start
        (a bisection on `totals`, all jumps side by side)."""
        lo, hi = self._bracket(b, s0, np.asarray(k, np.int64), seconds)
        idx = np.flatnonzero(lo < hi)
        while len(idx):
            mid = (lo[idx] + hi[idx] + 1) // 2
            fits = self.totals(b[idx], s0[idx], mid) <= seconds[idx] + 1e-12
            lo[idx] = np.where(fits, mid, lo[idx])
            hi[idx] = np.where(fits, hi[idx], mid - 1)
            idx = idx[lo[idx] < hi[idx]]
        return lo


@dataclass(frozen=True)
class PrefillCurve:
    """Prefill seconds over a log grid of token counts (sequences of the workload's mean prompt)."""

    log_tokens: tuple[float, ...]
    log_seconds: tuple[float, ...]

    @classmethod
    def build(
        cls, cm: CostModel, gpu: GpuType, model: ModelSpec, tp: int, max_tokens: float, context: float
    ) -> PrefillCurve:
        tokens = np.unique(np.geomspace(1, max(max_tokens, 2), 48).round())
        secs = cm.prefill(gpu, model, tp, tokens, np.minimum(context, tokens)).seconds
        return cls(tuple(np.log(tokens).tolist()), tuple(np.log(secs).tolist()))

    def __call__(self, tokens: float) -> float:
        return prefill_one(*self._grid, float(tokens))

    def many(self, tokens: np.ndarray) -> np.ndarray:
        """`self(t)` for every t."""
        return prefill_many(*self._grid, np.asarray(tokens, np.float64))

    @cached_property
    def _grid(self) -> tuple[np.ndarray, np.ndarray]:
        """The log grid as arrays (made once: the event loop prefills at every admission)."""
        return np.array(self.log_tokens), np.array(self.log_seconds)
