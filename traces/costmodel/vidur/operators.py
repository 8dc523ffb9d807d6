"""Vidur's raw operator tables, read as curves: one layer's operator times by token count, all-reduce by bytes.

mlp.csv (vidur/profiling/mlp) times every operator of one transformer layer on one GPU of a TP
group (the linears already split 1/TP), in milliseconds, at token counts 1, 2, 4, 8, 16, ... ; the
columns are time_stats.<op>.median. all_reduce.csv (vidur/profiling/collectives) times NCCL
all-reduces of `size` bytes on `num_workers` GPUs, `devices_per_node` of them per node.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from traces.errors import SpecError
from traces.models import ModelSpec

# The operators of one layer that Vidur's ExecutionTime adds up (attention's own kernels aside: those are
# in attention.csv). The embedding lookup (emb) is measured but, as in Vidur, not counted.
LAYER_OPS = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm",
             "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")
# Vidur fills these with 0 when a model lacks them (e.g. no post-attention norm)
OPTIONAL_OPS = ("input_layernorm", "post_attention_layernorm", "add")
# all_reduce.csv's small messages take one of two times (e.g. 0.02 or 0.06 ms on 4 A100s) from one size to
# the next; Vidur fits a regression over them, here a centred mean over this many neighbouring sizes
SMOOTH_SIZES = 9
# mlp.csv's shape columns and the ModelSpec field each must equal
SHAPES = {"n_head": "heads", "n_kv_head": "kv_heads", "n_embd": "hidden", "n_expanded_embd": "intermediate",
          "use_gated_mlp": "gated_mlp"}


@dataclass(frozen=True)
class LayerCurve:
    """Measured milliseconds of one layer's operators on one GPU at TP `tp`, by token count."""

    tp: int
    tokens: np.ndarray  # ascending, unique
    layer_ms: np.ndarray  # the sum of LAYER_OPS
    up_proj_ms: np.ndarray  # mlp_up_proj alone (the LM head is priced from it)

    def at(self, tokens: np.ndarray, values: np.ndarray) -> np.ndarray:
        """`values` interpolated linearly at `tokens`; NaN outside the measured counts (never extrapolated)."""
        t = np.asarray(tokens, float)
        out = np.interp(t, self.tokens, values)
        return np.where((t >= self.tokens[0]) & (t <= self.tokens[-1]), out, np.nan)


@dataclass(frozen=True)
class AllReduceCurve:
    """Measured milliseconds of one all-reduce on `tp` GPUs of one node, by message bytes."""

    tp: int
    nbytes: np.ndarray  # ascending, unique
    ms: np.ndarray

    def at(self, nbytes: np.ndarray) -> np.ndarray:
        """Interpolated inside the table; below it the smallest message's time (latency-bound); above
        it the largest's scaled by size (bandwidth-bound: time proportional to bytes)."""
        n = np.asarray(nbytes, float)
        inside = np.interp(n, self.nbytes, self.ms)
        return np.where(n > self.nbytes[-1], self.ms[-1] * n / self.nbytes[-1], inside)


def read_mlp(path: Path, spec: ModelSpec) -> dict[int, LayerCurve]:
    """Every TP degree's layer curve in `path`, after checking its layer shapes are `spec`'s."""
    frame = _read(path)
    for col, field in SHAPES.items():
        if col not in frame.columns:
            raise SpecError(f"{path}: no {col} column; is this Vidur's mlp.csv?")
        found = sorted({str(v) for v in frame[col]})
        expected = str(getattr(spec, field))
        if found != [expected]:
            raise SpecError(f"{path}: {col} is {', '.join(found)} but rlfleet's {spec.name} has {field} {expected}; "
                            "map this table to the model with these shapes")
    for op in OPTIONAL_OPS:
        col = f"time_stats.{op}.median"
        frame[col] = frame[col].fillna(0) if col in frame.columns else 0.0
    cols = [f"time_stats.{op}.median" for op in LAYER_OPS]
    missing = [c for c in (*cols, "num_tokens", "num_tensor_parallel_workers") if c not in frame.columns]
    if missing:
        raise SpecError(f"{path}: missing column {missing[0]}; is this Vidur's mlp.csv?")
    # a token count on the boundary of two of Vidur's profiling ranges is measured twice: their mean
    grouped = frame.groupby(["num_tensor_parallel_workers", "num_tokens"], as_index=False)[cols].mean()
    curves: dict[int, LayerCurve] = {}
    for tp, rows in grouped.groupby("num_tensor_parallel_workers"):
        rows = rows.sort_values("num_tokens")
        curves[int(tp)] = LayerCurve(int(tp), rows["num_tokens"].to_numpy(float), rows[cols].sum(axis=1).to_numpy(),
                                     rows["time_stats.mlp_up_proj.median"].to_numpy(float))
    return curves


def read_all_reduce(path: Path) -> dict[int, AllReduceCurve]:
    """All-reduce curves within one node (devices_per_node = num_workers), as Vidur selects them,
    each size's median time evened out over its SMOOTH_SIZES neighbours."""
    frame = _read(path)
    missing = [c for c in ("time_stats.all_reduce.median", "num_workers", "devices_per_node", "size", "collective")
               if c not in frame.columns]
    if missing:
        raise SpecError(f"{path}: missing column {missing[0]}; is this Vidur's all_reduce.csv?")
    frame = frame[(frame["collective"] == "all_reduce") & (frame["devices_per_node"] == frame["num_workers"])]
    curves: dict[int, AllReduceCurve] = {}
    for tp, rows in frame.groupby("num_workers"):
        by_size = rows.groupby("size")["time_stats.all_reduce.median"].mean().sort_index()
        smooth = by_size.rolling(SMOOTH_SIZES, center=True, min_periods=1).mean()
        curves[int(tp)] = AllReduceCurve(int(tp), by_size.index.to_numpy(float), smooth.to_numpy(float))
    return curves


def _read(path: Path) -> pd.DataFrame:
    try:
        frame = pd.read_csv(path).drop_duplicates()
    except FileNotFoundError:
        raise SpecError(f"{path}: no such file; give Vidur's data/profiling folder") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
        raise SpecError(f"{path}: not a Vidur CSV ({str(exc).splitlines()[0]})") from None
    if frame.empty:
        raise SpecError(f"{path}: no rows; give a complete Vidur profile")
    return frame
