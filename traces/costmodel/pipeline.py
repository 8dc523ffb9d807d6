"""The pipeline's slowest stage: the output layer (LM head) and the loss sit on the last one.

Megatron-LM builds the output layer (hidden x vocab) and the cross-entropy loss on the last pipeline
stage only (its GPTModel is built with post_process on that stage) and by default splits the decoder
layers evenly over the stages, so the last stage carries layers/pp layers plus the head. In a 1F1B
schedule, interleaved or not, every rank runs every micro-batch once forward and once backward, so
the slowest rank sets the pace of the whole pipeline. Megatron-LM offers the remedies that show the
imbalance is real: `--account-for-loss-in-pipeline-split` ("loss layer will be treated as a standard
transformer layer in the context of partition and placement for pipeline parallelism"; likewise
`--account-for-embedding-in-pipeline-split`, megatron/training/arguments.py), `--decoder-last-pipeline-
num-layers`, and `--pipeline-model-parallel-layout`, "use it to balance partitioning for an
imbalanced model" (docs.nvidia.com/megatron/parallelism-guide/pipeline-parallel-layout, its example
puts the loss alone on the last chunk). Llama 3's 405B run takes one layer off the first and the last
stage for the same reason (arXiv:2407.21783 sec. 3.3.2).

The model: a decoder layer costs what the trained token's FLOPs less the head's, over the layers; the
last rank runs `last_stage_layers` of them (layers / pp by default) plus the head, every other rank an
even share of the rest; the pipeline runs at the slowest rank. The head is counted by its matmul
(2 V h FLOPs a token forward, twice that backward; not recomputed: Megatron's recompute covers the
transformer layers); the loss's softmax over V is elementwise and left out. The first stage's
embedding lookup is a gather: no FLOPs.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from traces.models import ModelSpec

Array = NDArray[np.float64]


def head_flops_per_token(model: ModelSpec, forward_only: bool = False, frozen: bool = False) -> float:
    """The output layer's matmul FLOPs per token: 2 V h forward, + 4 V h backward (data and weight
    grads), or + 2 V h when the weights are frozen (LoRA: data gradients only)."""
    return (2.0 if forward_only else 4.0 if frozen else 6.0) * model.vocab * model.hidden


def stage_imbalance(
    model: ModelSpec, pp: ArrayLike, per_token: ArrayLike, *, forward_only: bool = False,
    last_stage_layers: ArrayLike | None = None, frozen: bool = False,
) -> Array:
    """The slowest pipeline rank's compute over the mean rank's (1 without pipelining).

    per_token: the trained token's FLOPs over the whole model (head included); last_stage_layers:
    decoder layers the last rank holds, over all its virtual chunks (None: layers / pp, Megatron's
    even split). A rank time is layers x per-layer FLOPs (+ the head on the last); mean = per_token / pp.
    """
    p = np.asarray(pp, dtype=np.float64)
    total = np.asarray(per_token, dtype=np.float64)
    head = head_flops_per_token(model, forward_only, frozen)
    per_layer = np.maximum(total - head, 0.0) / model.layers
    if last_stage_layers is None:
        last_layers = model.layers / np.maximum(p, 1.0)
    else:
        last_layers = np.asarray(last_stage_layers, dtype=np.float64)
    last = last_layers * per_layer + head
    rest = (model.layers - last_layers) / np.maximum(p - 1, 1.0) * per_layer
    slowest = np.maximum(last, rest)
    return np.where(p > 1, slowest * p / np.maximum(total, 1e-300), 1.0)
