"""Decode without CUDA graphs: the launch cost per iteration an eager engine adds.

vLLM replays a captured CUDA graph per decode iteration (one launch for the whole forward pass) at
the batch sizes it captured; with `enforce_eager`, or at a batch above its largest captured size
(`max_cudagraph_capture_size`), the forward pass launches its kernels one by one from Python. The
fitted Efficiency.decode_overhead_s is that of graph-captured engines (the calibration rows ran
with graphs on), so an eager iteration costs this much more, for every layer's kernels.

Size: vLLM PR #1440 (the first CUDA-graph patch for Llama, github.com/vllm-project/vllm/pull/1440)
measured Llama-2-7B (32 layers, no TP) at batch 1 generating 100 tokens in 1.05 s with graphs and
1.2 s without: 1.5 ms per iteration, 47 us per layer; "at bigger batch sizes I don't see visible
gain", as an additive launch cost becomes small next to a longer iteration.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from traces.models import ModelSpec

EAGER_SECONDS_PER_LAYER = (1.2 - 1.05) / 100 / 32  # vLLM PR #1440: Llama-2-7B, batch 1


def eager_overhead_seconds(model: ModelSpec, batch: ArrayLike, *, enforce_eager: bool,
                           graph_max_batch: int | None) -> np.ndarray:
    """Seconds an iteration of `batch` sequences adds over a graph-replayed one: all of them when
    the engine is eager, those above `graph_max_batch` when it captures graphs up to that size
    (None: no limit, the fitted cost model as it is)."""
    b = np.asarray(batch, float)
    eager = np.full(b.shape, enforce_eager) if graph_max_batch is None else (b > graph_max_batch) | enforce_eager
    return np.where(eager, model.layers * EAGER_SECONDS_PER_LAYER, 0.0)
