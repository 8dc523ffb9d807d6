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


def remote_nodes_hit(experts: int, top_k: int, nodes: ArrayLike) -> Array:
    """Expected other nodes holding at least one of a token's top-k experts, the experts spread evenly
    over `nodes` nodes and routed uniformly (k distinct experts): (nodes - 1) (1 - C(E - E/nodes, k) / C(E, k))."""
    n = np.maximum(_f(nodes), 1.0)
    miss = np.ones_like(n)
    for i in range(top_k):  # C(E - E/n, k) / C(E, k) as a product of k ratios
        miss = miss * np.maximum(experts - experts / n - i, 0.0) / (experts - i)
    return (n - 1) * (1 - miss)


def train_alltoall_seconds(
    model: ModelSpec, dp: ArrayLike, tp: ArrayLike, pp: ArrayLike, ep: ArrayLike, tokens: ArrayLike,
    eff: Efficiency, *, passes: float, link_bytes_per_s: float, gpus_per_node: int, inter_node_bytes_per_s: float,
) -> Array:
    """Expert-parallel token traffic of one training step: per pass, 2 all-to-alls (dispatch and
    combine) per MoE layer of a pipeline stage, each carrying the GPU's tokens (N / (dp tp), sequence
    parallel) x top-k x hidden. The EP group is ep consecutive dp x tp ranks: over the node's link
    while it fits one node. Across nodes the dispatch is node-deduplicated, as DeepEP's normal kernels
    (Megatron-Core's DeepEP/HybridEP dispatchers) send it: a token crosses the network once per remote
    node holding any of its experts (remote_nodes_hit), at the NIC's rate (DeepEP docs/legacy.md,
    github.com/deepseek-ai/DeepEP: 43-58 GB/s RDMA bottleneck bandwidth at EP16-64 on H800 with
    ~50 GB/s CX7 NICs), and is forwarded to its top-k GPUs over NVLink within the node, overlapped
    with the network leg (the slower of the two counts)."""
    if model.moe is None:
        return np.zeros(np.broadcast(_f(dp), _f(tp), _f(pp), _f(ep), _f(tokens)).shape)
    d, t, p, e, n = _f(dp), _f(tp), _f(pp), _f(ep), _f(tokens)
    token_bytes = n / (d * t) * model.hidden * model.bytes_per_param
    msg = token_bytes * model.moe.experts_per_token
    within = alltoall_seconds(msg, e, link_bytes_per_s, eff)
    nodes = np.maximum(e / gpus_per_node, 1.0)
    network = token_bytes * remote_nodes_hit(model.moe.experts, model.moe.experts_per_token, nodes)
    forward = (gpus_per_node - 1) / gpus_per_node * msg / link_bytes_per_s
    across = np.maximum(network / inter_node_bytes_per_s, forward) + eff.collective_latency_s
    return passes * 2 * (model.moe_layers / p) * np.where(e <= gpus_per_node, within, across)


def expert_train_matmul(eff: Efficiency) -> float:
    """Share of the dense training matmul rate routed-expert FLOPs reach (Efficiency.expert_matmul)."""
    return eff.expert_matmul


def routed_flops_per_token(model: ModelSpec, passes: float) -> float:
    """Matmul FLOPs one token spends in its routed experts over `passes` passes (forward = 1,
    backward = 2): 2 FLOPs per active expert parameter per pass."""
    if model.moe is None:
        return 0.0
    return 2.0 * passes * model.moe_layers * model.moe.experts_per_token * model.moe.expert_params(model.hidden)
