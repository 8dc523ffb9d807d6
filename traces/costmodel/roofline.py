"""Analytic (roofline) costs. Pure numpy functions: every count argument may be an array.

Notation: P = parameters doing matmuls, W = weight bytes, kv = KV bytes per token (all layers),
F = bf16 peak FLOP/s, BW = HBM bytes/s, e_* = fitted efficiencies (efficiency.py).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from traces.costmodel.efficiency import Efficiency
from traces.hardware import GpuType
from traces.models import ModelSpec

Array = NDArray[np.float64]


def _f(x: ArrayLike) -> Array:
    return np.asarray(x, dtype=np.float64)


def _matmul_eff(gpu: GpuType, eff: Efficiency) -> float:
    return gpu.matmul_ceiling * eff.matmul


def _memory_eff(gpu: GpuType, eff: Efficiency) -> float:
    return eff.memory


def allreduce_seconds(nbytes: ArrayLike, ranks: ArrayLike, link_bytes_per_s: float, eff: Efficiency) -> Array:
    """Ring all-reduce: each rank sends and receives 2(n-1)/n of the message, plus a latency."""
    n = _f(ranks)
    traffic = 2 * (n - 1) / np.maximum(n, 1) * _f(nbytes)
    return np.where(n > 1, traffic / link_bytes_per_s + eff.collective_latency_s, 0.0)


def decode_seconds(
    gpu: GpuType, model: ModelSpec, tp: ArrayLike, batch: ArrayLike, context: ArrayLike, eff: Efficiency
) -> Array:
    """One decode iteration of an engine: B sequences at mean context L, TP t.

    max(compute, memory) + TP all-reduces + an overhead (fixed + per running sequence), where
    compute = (2 P B + 4 layers B L q_dim) / (t F e_mm)   (matmuls + attention scores/values)
    memory  = (W + B L kv) / (t BW e_mem)                  (stream weights and the KV cache once)
    TP: 2 all-reduces per layer of B x hidden activations over the intra-node link.
    """
    t, b, ctx = _f(tp), _f(batch), _f(context)
    flops = 2 * model.compute_params * b + 4 * model.layers * b * ctx * model.q_dim
    compute = flops / (t * gpu.bf16_flops * _matmul_eff(gpu, eff))
    memory = (model.weight_bytes + b * ctx * model.kv_bytes_per_token) / (
        t * gpu.hbm_bytes_per_s * _memory_eff(gpu, eff)
    )
    msg = b * model.hidden * model.bytes_per_param
    tp_comm = 2 * model.layers * allreduce_seconds(msg, t, gpu.link_bytes_per_s, eff)
    return np.maximum(compute, memory) + tp_comm + eff.decode_overhead_s + eff.decode_overhead_per_seq_s * b


def prefill_seconds(
    gpu: GpuType, model: ModelSpec, tp: ArrayLike, tokens: ArrayLike, context: ArrayLike, eff: Efficiency
) -> Array:
    """Prefill T tokens of sequences about L long: 2 P T + causal attention 2 layers T L q_dim FLOPs.

    Weights are read once per pass (memory floor); TP adds 2 all-reduces per layer of T x hidden.
    """
    t, n, ctx = _f(tp), _f(tokens), _f(context)
    flops = 2 * model.compute_params * n + 2 * model.layers * n * ctx * model.q_dim
    compute = flops / (t * gpu.bf16_flops * _matmul_eff(gpu, eff))
    memory = model.weight_bytes / (t * gpu.hbm_bytes_per_s * _memory_eff(gpu, eff))
    msg = n * model.hidden * model.bytes_per_param
    tp_comm = 2 * model.layers * allreduce_seconds(msg, t, gpu.link_bytes_per_s, eff)
    return np.maximum(compute, memory) + tp_comm + eff.prefill_overhead_s


def kv_capacity_tokens(gpu: GpuType, model: ModelSpec, tp: ArrayLike, eff: Efficiency, resident_bytes: float = 0.0
                       ) -> Array:
    """Tokens of KV cache an engine of TP t can hold: (t (f HBM - reserve - resident) - W) / kv.

    When t exceeds the KV heads, heads are replicated, so each GPU holds 1/kv_heads of kv.
    `resident_bytes` per GPU belong to someone else (a colocated trainer's states kept in HBM).
    """
    t = _f(tp)
    free_per_gpu = gpu.hbm_bytes * eff.engine_memory_fraction - eff.engine_reserve_bytes - model.weight_bytes / t
    if resident_bytes:
        free_per_gpu = free_per_gpu - resident_bytes
    kv_per_gpu_per_token = model.kv_bytes_per_token * np.maximum(1 / t, 1 / model.kv_heads)
    return np.maximum(free_per_gpu, 0.0) / kv_per_gpu_per_token


def train_flops_per_token(model: ModelSpec, seq_len: ArrayLike) -> Array:
    """Model FLOPs per trained token, the MFU convention of Megatron/torchtitan:
    6 P (forward + backward matmuls) + 12 layers s q_dim (attention, no causal discount)."""
    return 6.0 * model.compute_params + 12.0 * model.layers * _f(seq_len) * model.q_dim


def _recompute_flops_per_token(model: ModelSpec, seq_len: Array, recompute: str) -> Array:
    if recompute == "full":  # the whole forward again
        return 2.0 * model.compute_params + 4.0 * model.layers * seq_len * model.q_dim
    # 'selective' recomputes the attention core (Korthikanti et al. 2022), which flash attention's
    # backward recomputes anyway: no extra FLOPs.
    return np.zeros_like(seq_len)


def _dp_bandwidth(gpu: GpuType, tp: Array, pp: Array, dp: Array, gpus_per_node: int, inter_node: float) -> Array:
    # DP groups span nodes once a replica plus its peers no longer fit one node.
    within_node = tp * pp * dp <= gpus_per_node
    return np.where(within_node, gpu.link_bytes_per_s, inter_node)


def train_seconds(
    gpu: GpuType,
    model: ModelSpec,
    dp: ArrayLike,
    tp: ArrayLike,
    pp: ArrayLike,
    tokens: ArrayLike,
    eff: Efficiency,
    *,
    seq_len: ArrayLike,
    microbatch_tokens: ArrayLike,
    zero_stage: int = 3,
    recompute: str = "selective",
    virtual_stages: int = 1,
    gpus_per_node: int = 8,
    inter_node_bytes_per_s: float = 50e9,
    forward_only: bool = False,
) -> Array:
    """One optimizer step over N tokens on dp x tp x pp GPUs (or one forward pass if forward_only).

    compute = flops N / (dp tp pp F e_train fill) x pipeline bubble (1 + (pp-1)/(m v)),
        fill = mb / (mb + half): a micro-batch of mb tokens fills the GPU less when small
    TP: 4 all-reduces per layer (2 forward, 2 backward) of the rank's tokens x hidden.
    DP: all-reduce of gradients 2(dp-1)/dp W/(tp pp) (+ parameter all-gathers under ZeRO-3),
        a share `comm_overlap` hidden behind compute (never less than what compute cannot hide).
    """
    d, t, p, n = _f(dp), _f(tp), _f(pp), _f(tokens)
    s, mb = _f(seq_len), _f(microbatch_tokens)
    gpus = d * t * p
    if forward_only:
        per_token = 2.0 * model.compute_params + 4.0 * model.layers * s * model.q_dim
    else:
        per_token = train_flops_per_token(model, s) + _recompute_flops_per_token(model, s, recompute)
    fill = mb / (mb + eff.train_half_tokens)  # small micro-batches leave the GPU part idle
    compute = per_token * n / (gpus * gpu.bf16_flops * (gpu.matmul_ceiling * eff.train_matmul) * fill)
    microbatches = np.maximum(np.ceil(n / d / mb), 1.0)
    compute = compute * (1 + (p - 1) / (microbatches * virtual_stages))

    passes = 1 if forward_only else 2  # forward (+ backward): all-reduces per layer each
    rank_tokens = n / d
    tp_msg = rank_tokens * model.hidden * model.bytes_per_param
    tp_comm = passes * 2 * (model.layers / p) * allreduce_seconds(tp_msg, t, gpu.link_bytes_per_s, eff)

    shard_bytes = model.weight_bytes / (t * p)
    # Forward: ZeRO-3 gathers parameters once. Step: reduce-scatter + all-gather of gradients,
    # plus ZeRO-3's second parameter gather in the backward pass.
    gathers = 1.0 if zero_stage == 3 else 0.0
    volume = gathers if forward_only else 2.0 + gathers
    dp_bw = _dp_bandwidth(gpu, t, p, d, gpus_per_node, inter_node_bytes_per_s)
    dp_comm = np.where(d > 1, volume * (d - 1) / d * shard_bytes / dp_bw, 0.0)
    exposed = np.maximum((1 - eff.comm_overlap) * dp_comm, dp_comm - compute)
    return compute + tp_comm + exposed


def train_memory_bytes(
    gpu: GpuType,
    model: ModelSpec,
    dp: ArrayLike,
    tp: ArrayLike,
    pp: ArrayLike,
    eff: Efficiency,
    *,
    microbatch_tokens: ArrayLike,
    seq_len: ArrayLike,
    zero_stage: int = 3,
    recompute: str = "selective",
) -> Array:
    """Peak bytes per GPU of mixed-precision Adam training: states (train_state_bytes) + activations.

    Activations per layer per token (Korthikanti et al. 2022, flash attention, sequence parallel):
    34 h / t bytes; 'none' adds the 5 a s attention-score term, 'full' keeps only the 2 h input.
    A 1F1B first stage holds pp microbatches of layers/pp layers. Logits: bf16 T x V / t.
    """
    t = _f(tp)
    p = _f(pp)
    mb, s = _f(microbatch_tokens), _f(seq_len)
    states = train_state_bytes(model, dp, tp, pp, zero_stage=zero_stage)
    h = model.hidden
    if recompute == "full":
        per_layer = 2.0 * h * mb
    elif recompute == "selective":
        per_layer = 34.0 * h * mb / t
    else:
        per_layer = (34.0 * h + 5.0 * model.heads * s) * mb / t
    # 1F1B: the first stage holds pp microbatches of layers/pp layers = one microbatch of all layers.
    activations = per_layer * model.layers * np.ones_like(p)
    logits = 2.0 * mb * model.vocab / t
    return states + activations + logits + eff.train_reserve_bytes


def train_state_bytes(model: ModelSpec, dp: ArrayLike, tp: ArrayLike, pp: ArrayLike, *, zero_stage: int = 3) -> Array:
    """Bytes per GPU of weights, gradients and Adam states (ZeRO paper, Rajbhandari et al. 2020).

    2 (bf16 weights) + 2 (grads) + 12 (fp32 master, m, v) bytes/param over tp pp; ZeRO stage
    1/2/3 shards the optimizer / +grads / +weights over dp.
    """
    weights, grads, optim = train_state_parts(model, dp, tp, pp, zero_stage=zero_stage)
    return weights + grads + optim


def train_state_parts(model: ModelSpec, dp: ArrayLike, tp: ArrayLike, pp: ArrayLike, *, zero_stage: int = 3
                      ) -> tuple[Array, Array, Array]:
    """(weights, gradients, optimizer states) bytes per GPU, as train_state_bytes sums them."""
    d, t, p = _f(dp), _f(tp), _f(pp)
    per_param = model.params / (t * p)
    weights, grads, optim = 2.0 * per_param, 2.0 * per_param, 12.0 * per_param
    if zero_stage >= 1:
        optim = optim / d
    if zero_stage >= 2:
        grads = grads / d
    if zero_stage >= 3:
        weights = weights / d
    return weights, grads, optim


def colocate_switch_seconds(
    gpu: GpuType, model: ModelSpec, engine_tp: ArrayLike, dp: ArrayLike, tp: ArrayLike, pp: ArrayLike,
    eff: Efficiency, *, zero_stage: int = 3, offload: tuple[bool, bool, bool] = (True, True, True),
    engine_sleep: int = 1,
) -> Array:
    """One hand-over of colocated GPUs between the rollout engine and the trainer.

    The side that stops offloads its part to host memory while the other loads its own back over
    the same PCIe link (full duplex, so the larger of the two transfers), plus a fixed cost for
    freeing and re-allocating the KV cache when the engine sleeps. A step has two hand-overs.
    `offload` says which of the trainer's weights, gradients and optimizer states move (verl's
    param_offload / grad_offload / optimizer_offload; those kept stay in HBM). The engine's part
    is vLLM's sleep level: 1 moves its weights to the host and back, 2 discards them (the weight
    sync that follows refills them), 0 keeps weights and KV cache resident (no fixed cost).
    """
    engine = model.weight_bytes / _f(engine_tp) if engine_sleep == 1 else np.zeros_like(_f(engine_tp))
    if all(offload):  # the sum of the three, as train_state_bytes adds them
        trainer = train_state_bytes(model, dp, tp, pp, zero_stage=zero_stage)
    else:
        parts = train_state_parts(model, dp, tp, pp, zero_stage=zero_stage)
        trainer = sum((part for part, moved in zip(parts, offload, strict=True) if moved), np.zeros_like(parts[0]))
    fixed = eff.switch_fixed_s if engine_sleep else 0.0
    return fixed + np.maximum(engine, trainer) / (gpu.host_bytes_per_s * eff.host_copy)


def sync_seconds(model: ModelSpec, engines: ArrayLike, path_bytes_per_s: ArrayLike, eff: Efficiency) -> Array:
    """Broadcast the weights from trainer rank 0 to K engines.

    fixed + n_tensors x per-tensor latency + W / bw, and a chunked tree broadcast adds one chunk
    time per extra tree level (ceil(log2(K+1)) levels).
    """
    k, bw = _f(engines), _f(path_bytes_per_s)
    chunk = np.minimum(model.weight_bytes, 256e6)
    levels = np.ceil(np.log2(k + 1))
    transfer = model.weight_bytes / bw + (levels - 1) * chunk / bw
    return eff.sync_fixed_s + model.n_tensors * eff.sync_per_tensor_s + transfer
