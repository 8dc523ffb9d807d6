"""Costs particular to mixture-of-experts models: experts touched, all-to-all traffic, expert shards.

Pure numpy over arrays, as roofline.py (which composes them into each stage's seconds).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from traces.costmodel.efficiency import Efficiency
from traces.models import ModelSpec
from traces.moe import expected_distinct_experts

Array = NDArray[np.float64]


def _f(x: ArrayLike) -> Array:
    return np.asarray(x, dtype=np.float64)


def alltoall_seconds(nbytes: ArrayLike, ranks: ArrayLike, link_bytes_per_s: ArrayLike, eff: Efficiency) -> Array:
    """All-to-all of a rank's `nbytes`: (n-1)/n of them leave the rank, plus a latency."""
    n = _f(ranks)
    traffic = (n - 1) / np.maximum(n, 1) * _f(nbytes)
    return np.where(n > 1, traffic / _f(link_bytes_per_s) + eff.collective_latency_s, 0.0)


def touched_weight_bytes(model: ModelSpec, tokens: ArrayLike) -> Array:
    """Weight bytes one forward pass over `tokens` tokens reads: every dense weight, and of each MoE
    layer's routed experts the expected distinct ones the tokens hit (uniform routing)."""
    n = _f(tokens)
    if model.moe is None:
        return np.full(n.shape, model.weight_bytes)
    hit = expected_distinct_experts(model.moe.experts, model.moe.experts_per_token, np.maximum(n, 1.0))
    dense = model.weight_bytes - model.expert_bytes
    return dense + model.moe_layers * hit * model.expert_bytes_each


def expert_ways(tp: ArrayLike, ep: ArrayLike) -> Array:
    """Ways a trainer splits each layer's routed experts: ep with expert parallelism (whole experts,
    Megatron-Core's expert tensor parallelism 1), else tp (each expert tensor-parallel)."""
    t, e = _f(tp), _f(ep)
    return np.where(e > 1, e, t)


def train_alltoall_seconds(
    model: ModelSpec, dp: ArrayLike, tp: ArrayLike, pp: ArrayLike, ep: ArrayLike, tokens: ArrayLike,
    eff: Efficiency, *, passes: float, link_bytes_per_s: float, gpus_per_node: int, inter_node_bytes_per_s: float,
) -> Array:
    """Expert-parallel token traffic of one training step: per pass, 2 all-to-alls (dispatch and
    combine) per MoE layer of a pipeline stage, each carrying the GPU's tokens (N / (dp tp), sequence
    parallel) x top-k x hidden. The EP group is ep consecutive dp x tp ranks: over the node's link
    while it fits one node, else over the network."""
    if model.moe is None:
        return np.zeros(np.broadcast(_f(dp), _f(tp), _f(pp), _f(ep), _f(tokens)).shape)
    d, t, p, e, n = _f(dp), _f(tp), _f(pp), _f(ep), _f(tokens)
    msg = n / (d * t) * model.moe.experts_per_token * model.hidden * model.bytes_per_param
    bw = np.where(e <= gpus_per_node, link_bytes_per_s, inter_node_bytes_per_s)
    return passes * 2 * (model.moe_layers / p) * alltoall_seconds(msg, e, bw, eff)


def expert_train_matmul(eff: Efficiency) -> float:
    """Share of the dense training matmul rate routed-expert FLOPs reach (Efficiency.expert_matmul)."""
    return eff.expert_matmul


def routed_flops_per_token(model: ModelSpec, passes: float) -> float:
    """Matmul FLOPs one token spends in its routed experts over `passes` passes (forward = 1,
    backward = 2): 2 FLOPs per active expert parameter per pass."""
    if model.moe is None:
        return 0.0
    return 2.0 * passes * model.moe_layers * model.moe.experts_per_token * model.moe.expert_params(model.hidden)
