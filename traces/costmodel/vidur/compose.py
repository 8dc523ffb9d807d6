"""One iteration's seconds from Vidur's operator curves, composed as Vidur composes them, plus what they lack.

Vidur (vidur/entities/execution_time.py, ExecutionTime.model_time) prices a layer as its operators
at the iteration's token count T plus two tensor-parallel all-reduces of T x hidden x 2 bytes (one
after attention, one after the MLP), each with a fixed NCCL launch cost (its
nccl_cpu_launch_overhead_ms, 0.02 ms), and multiplies by the layers. What the stored tables lack
is priced here, and each row's source says so:
- attention's own kernels and, at decode, the KV-cache read: Vidur's attention.csv is not in the
  stored copy, so they come from rlfleet's roofline (traces/costmodel/roofline.py) as the part of
  its iteration time that grows with context: roofline(T, L) - roofline(T, 0);
- the LM head (model_time leaves out the embedding and the LM head): a column-parallel GEMM like
  mlp_up_proj, so the measured up-projection at the same token count times the ratio of their
  weight matrices, vocab / up-projection width (2 x intermediate for SwiGLU). Logits are computed
  for each decoding sequence, and for each prompt's last token in a prefill (as vLLM does);
- decode: rlfleet's per-iteration cost (Efficiency.decode_overhead_s plus decode_overhead_per_seq_s
  per running sequence: scheduling, sampling, launches), as Vidur's cpu_overheads.csv is absent too;
  prefill rows carry Efficiency.prefill_overhead_s, like the roofline's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from traces.costmodel import roofline as rf
from traces.costmodel.efficiency import Efficiency
from traces.costmodel.vidur.operators import AllReduceCurve, LayerCurve
from traces.hardware import GpuType
from traces.models import ModelSpec

NCCL_LAUNCH_MS = 0.02  # Vidur's BaseExecutionTimePredictorConfig.nccl_cpu_launch_overhead_ms
ALL_REDUCES_PER_LAYER = 2  # attention's and the MLP's (ExecutionTime adds the TP time to each)
PARTS = ("layers_s", "all_reduce_s", "lm_head_s", "attention_s", "overhead_s")


@dataclass(frozen=True)
class Curves:
    """What one (GPU, model, TP) iteration is composed from."""

    gpu: GpuType
    model: ModelSpec
    layer: LayerCurve
    all_reduce: AllReduceCurve | None  # None at TP 1

    def measured(self, tokens: np.ndarray, logits: np.ndarray) -> dict[str, np.ndarray]:
        """Seconds of the layers, the TP all-reduces and the LM head at `tokens` per iteration
        (`logits` of them sampled); NaN outside the measured token counts."""
        m = self.model
        layers = m.layers * self.layer.at(tokens, self.layer.layer_ms) / 1e3
        if self.all_reduce is None:
            comm = np.zeros_like(layers)
        else:
            one = self.all_reduce.at(np.asarray(tokens, float) * m.hidden * 2) + NCCL_LAUNCH_MS
            comm = ALL_REDUCES_PER_LAYER * m.layers * one / 1e3
        up_width = m.intermediate * (2 if m.gated_mlp else 1)
        lm_head = self.layer.at(logits, self.layer.up_proj_ms) * m.vocab / up_width / 1e3
        return {"layers_s": layers, "all_reduce_s": comm, "lm_head_s": lm_head}


def decode_rows(curves: Curves, batches: np.ndarray, contexts: np.ndarray, eff: Efficiency) -> pd.DataFrame:
    """One row per (batch B, mean context L): B tokens through the layers, B logits."""
    b, ctx = (a.ravel() for a in np.meshgrid(np.asarray(batches, float), np.asarray(contexts, float), indexing="ij"))
    g, m, t = curves.gpu, curves.model, curves.layer.tp
    parts = curves.measured(b, b)
    parts["attention_s"] = rf.decode_seconds(g, m, t, b, ctx, eff) - rf.decode_seconds(g, m, t, b, 0.0, eff)
    parts["overhead_s"] = eff.decode_overhead_s + eff.decode_overhead_per_seq_s * b  # as the roofline's
    return _frame("decode", curves, b, ctx, np.zeros_like(b), parts)


def prefill_rows(curves: Curves, batches: np.ndarray, contexts: np.ndarray, max_tokens: int,
                 eff: Efficiency) -> pd.DataFrame:
    """One row per (prompts B, prompt length L) with B x L <= max_tokens: B L tokens, B logits."""
    b, ctx = (a.ravel() for a in np.meshgrid(np.asarray(batches, float), np.asarray(contexts, float), indexing="ij"))
    keep = b * ctx <= max_tokens
    b, ctx = b[keep], ctx[keep]
    tokens = b * ctx
    g, m, t = curves.gpu, curves.model, curves.layer.tp
    parts = curves.measured(tokens, b)
    parts["attention_s"] = rf.prefill_seconds(g, m, t, tokens, ctx, eff) - rf.prefill_seconds(g, m, t, tokens, 0.0, eff)
    parts["overhead_s"] = np.full(tokens.shape, eff.prefill_overhead_s)  # as the roofline's
    return _frame("prefill", curves, b, ctx, tokens, parts)


def _frame(stage: str, curves: Curves, batch: np.ndarray, context: np.ndarray, tokens: np.ndarray,
           parts: dict[str, np.ndarray]) -> pd.DataFrame:
    frame = pd.DataFrame({
        "gpu_type": curves.gpu.name, "model": curves.model.name, "stage": stage, "tp": curves.layer.tp,
        "pp": 1, "dp": 1, "batch": batch.astype(np.int64), "context": context.astype(np.int64),
        "tokens": tokens.astype(np.int64), **{p: parts[p] for p in PARTS},
    })
    frame["seconds"] = frame[list(PARTS)].sum(axis=1, skipna=False)
    return frame[frame["seconds"].notna()].reset_index(drop=True)  # past Vidur's token counts: no row
