"""Decode and prefill tables of one kind of engine, tabulated from the cost model (traces.costmodel)
so the event loop never calls it.

Decode iteration time depends on the running sequences B and their total context S (attention
and KV reads grow with S; see traces.costmodel.roofline.decode_seconds). For each engine type it
is tabulated exactly over B and on a uniform S grid, linear in between. Sums of k consecutive
iterations (S grows by B per iteration) are then closed-form arithmetic series per grid cell.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property, lru_cache

import numpy as np

from sim.kernels.decode_sums import jump_total, jump_totals, stop_after
from sim.kernels.prefill_curve import prefill_many, prefill_one
from traces import CostModel, GpuType, ModelSpec

GRID_POINTS = 64


@dataclass(frozen=True, eq=False)  # compared by identity: engines of one kind share one table
class DecodeTable:
    ds: float  # grid spacing in tokens of total context
    rows: tuple[tuple[float, ...], ...]  # rows[b][g] = seconds of one iteration, b running, S = g*ds
    # on cell g of row b, t = base_arr[b, g] + slope_arr[b, g] * S: precomputed, as the event loop
    # sums iterations at every completion
    base_arr: np.ndarray = field(init=False, repr=False, compare=False)
    slope_arr: np.ndarray = field(init=False, repr=False, compare=False)
    stack: DecodeStack = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # element-wise IEEE arithmetic in the scalar formulas' order, so the same bits as Python floats:
        # slope = (t[c+1] - t[c]) / ds, base = t[c] - slope * c * ds
        rows = np.array(self.rows, np.float64).reshape(len(self.rows), -1)
        cells = np.arange(rows.shape[1] - 1)
        slope_arr = (rows[:, 1:] - rows[:, :-1]) / self.ds
        base_arr = rows[:, :-1] - slope_arr * cells * self.ds
        object.__setattr__(self, "base_arr", base_arr)
        object.__setattr__(self, "slope_arr", slope_arr)
        # itself as a stack of one, for the compiled passes (an engine's cut, at every interrupt)
        object.__setattr__(self, "stack", DecodeStack(base_arr[None], slope_arr[None], np.array([self.ds])))

    @classmethod
    def build(
        cls, cm: CostModel, gpu: GpuType, model: ModelSpec, tp: int, max_batch: int, max_context: float,
        ep: int = 1, *, enforce_eager: bool = False, graph_max_batch: int | None = None,
    ) -> DecodeTable:
        ds = max(max_context, 1.0) / (GRID_POINTS - 1)
        b = np.arange(0, max_batch + 1)[:, None]
        s = (np.arange(GRID_POINTS) * ds)[None, :]
        secs = cm.decode(gpu, model, tp, np.maximum(b, 1), s / np.maximum(b, 1), ep, enforce_eager=enforce_eager,
                         graph_max_batch=graph_max_batch).seconds
        return cls(ds, tuple(map(tuple, np.asarray(secs, np.float64).tolist())))

    def total(self, b: int, s0: float, k: int) -> float:
        """Seconds of k iterations starting at total context s0: sum_{j<k} t(b, s0 + b j)."""
        return jump_total(self.base_arr, self.slope_arr, self.ds, b, s0, k)

    def totals(self, b: np.ndarray, s0: np.ndarray, k: np.ndarray) -> np.ndarray:
        """`total` of many jumps at once, bit for bit: the same arithmetic, compiled (sim.kernels.decode_sums)."""
        b, s0, k = np.asarray(b, np.int64), np.asarray(s0, np.float64), np.asarray(k, np.int64)
        return jump_totals(self.base_arr, self.slope_arr, self.ds, b, s0, k)

    def stop_after(self, b: np.ndarray, s0: np.ndarray, k: np.ndarray, elapsed: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
        """Jumps in progress `elapsed` seconds after they started, stopped after their current
        iteration (one that started at `elapsed` runs one iteration): (iterations run, seconds left)."""
        return self.stack.stop_after(np.zeros(len(k), np.int64), b, s0, k, elapsed)


@dataclass(frozen=True, eq=False)
class DecodeStack:
    """Decode tables of several kinds of engine as one set of arrays, for compiled passes over a
    mixed fleet: table t is base[t], slope[t] (rows padded to the largest batch) and ds[t]."""

    base: np.ndarray
    slope: np.ndarray
    ds: np.ndarray

    def stop_after(self, table: np.ndarray, b: np.ndarray, s0: np.ndarray, k: np.ndarray, elapsed: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
        """DecodeTable.stop_after for jumps of several kinds (jump i on table[i])."""
        return stop_after(self.base, self.slope, self.ds, np.asarray(table, np.int64), np.asarray(b, np.int64),
                          np.asarray(s0, np.float64), np.asarray(k, np.int64), np.asarray(elapsed, np.float64))


ONE_TABLE = np.zeros(1, np.int64)  # the index of a lone table in its own stack


def stack_of(tables: Sequence[DecodeTable]) -> tuple[DecodeStack, np.ndarray]:
    """The distinct tables among `tables`, stacked, and the index of each one in the stack."""
    if len(tables) == 1:  # one engine's cut or plan, at every interrupt of a busy small fleet
        return tables[0].stack, ONE_TABLE
    distinct = tuple({id(t): t for t in tables}.values())
    where = {id(t): i for i, t in enumerate(distinct)}
    return _stack(distinct), np.array([where[id(t)] for t in tables], np.int64)


@lru_cache(maxsize=32)  # keyed by identity (DecodeTable compares so): a fleet's few kinds, stacked once
def _stack(tables: tuple[DecodeTable, ...]) -> DecodeStack:
    if len(tables) == 1:
        return tables[0].stack
    rows = max(t.base_arr.shape[0] for t in tables)
    cells = tables[0].base_arr.shape[1]  # the last cell extends to infinity: every table has as many
    assert all(t.base_arr.shape[1] == cells for t in tables), "decode tables on different grids"
    base, slope = np.zeros((len(tables), rows, cells)), np.zeros((len(tables), rows, cells))
    for i, t in enumerate(tables):  # rows past a table's largest batch are never read
        base[i, :len(t.base_arr)], slope[i, :len(t.slope_arr)] = t.base_arr, t.slope_arr
    return DecodeStack(base, slope, np.array([t.ds for t in tables]))


@dataclass(frozen=True)
class PrefillCurve:
    """Prefill seconds over a log grid of token counts (sequences of the workload's mean prompt)."""

    log_tokens: tuple[float, ...]
    log_seconds: tuple[float, ...]

    @classmethod
    def build(
        cls, cm: CostModel, gpu: GpuType, model: ModelSpec, tp: int, max_tokens: float, context: float,
        ep: int = 1,
    ) -> PrefillCurve:
        tokens = np.unique(np.geomspace(1, max(max_tokens, 2), 48).round())
        secs = cm.prefill(gpu, model, tp, tokens, np.minimum(context, tokens), ep).seconds
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
