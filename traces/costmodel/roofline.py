"""Analytic (roofline) costs. Pure numpy functions: every count argument may be an array.

Notation: P = parameters doing matmuls (a token's active ones), W = weight bytes, kv = KV bytes
per token (all layers), F = bf16 peak FLOP/s, BW = HBM bytes/s, e_* = fitted efficiencies
(efficiency.py).

Mixture-of-experts models (traces/moe.py): a pass reads the dense weights plus the experts its
tokens touch (moe.expected_distinct_experts), and computes on the active parameters. An engine's
`ep` (1, or its tp) shards the experts whole over its GPUs and runs attention data-parallel, one
replica per GPU (SGLang's --enable-dp-attention with --ep-size tp; vLLM's --enable-expert-parallel
with data-parallel attention); tokens then reach their experts by two all-to-alls per MoE layer,
dispatch and combine (GShard, Lepikhin et al. 2020, arXiv:2006.16668, sec. 3.2). A trainer's `ep`
shards the experts over ep of its dp x tp ranks (Megatron-Core's expert parallelism with expert
tensor parallelism 1; ZeRO then shards expert states over the remaining dp x tp / ep ranks).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from traces.costmodel.efficiency import Efficiency
from traces.costmodel.elementwise import pass_bytes_per_token
from traces.costmodel.experts import (
    alltoall_seconds,
    expert_train_matmul,
    expert_ways,
    routed_flops_per_token,
    touched_weight_bytes,
    train_alltoall_seconds,
)
from traces.costmodel.pipeline import stage_imbalance
from traces.hardware import GpuType
from traces.lora import adapter_bytes, adapter_params, adapter_tensors, flops_per_token_change
from traces.models import ModelSpec
from traces.moe import attention_replicas

Array = NDArray[np.float64]


def _f(x: ArrayLike) -> Array:
    return np.asarray(x, dtype=np.float64)


def _matmul_eff(gpu: GpuType, eff: Efficiency) -> float:
    return gpu.matmul_ceiling * eff.matmul


def _memory_eff(gpu: GpuType, eff: Efficiency) -> float:
    return eff.memory


def roof_seconds(compute: ArrayLike, memory: ArrayLike, eff: Efficiency) -> Array:
    """A pass's time from its compute and memory times: the larger one, or their p-norm
    (Efficiency.roofline_p), which adds most where the two are equal."""
    c, m = _f(compute), _f(memory)
    if eff.roofline_p <= 0:
        return np.maximum(c, m)
    p = eff.roofline_p
    top = np.maximum(np.maximum(c, m), 1e-300)  # scaled: no overflow of a tiny time to a power
    return top * ((c / top) ** p + (m / top) ** p) ** (1 / p)


def allreduce_seconds(nbytes: ArrayLike, ranks: ArrayLike, link_bytes_per_s: float, eff: Efficiency) -> Array:
    """Ring all-reduce: each rank sends and receives 2(n-1)/n of the message, plus a latency.

    `link_bytes_per_s` is one direction (GpuType.link_bytes_per_s): sends and receives overlap, so
    the time is the traffic over it, i.e. nccl-tests' busbw = algbw x 2(n-1)/n (doc/PERFORMANCE.md)."""
    n = _f(ranks)
    traffic = 2 * (n - 1) / np.maximum(n, 1) * _f(nbytes)
    return np.where(n > 1, traffic / link_bytes_per_s + eff.collective_latency_s, 0.0)


def _attention_split(tp: Array, ep: Array) -> tuple[Array, Array]:
    """(attention TP ways, attention replicas) of an engine: an EP engine runs one replica per GPU."""
    replicas = attention_replicas(ep)
    return tp / replicas, replicas


def _engine_pass_seconds(
    gpu: GpuType, model: ModelSpec, tp: Array, ep: Array, tokens: Array, flops: Array, kv_bytes: Array,
    eff: Efficiency,
) -> tuple[Array, Array]:
    """(roof_seconds(compute, memory), communication) of one engine forward pass over `tokens` tokens.

    Per GPU: compute = flops / (t F e_mm); memory = (dense W / a + (touched experts + KV) / t) /
    (BW e_mem), with a = t (TP) or 1 (EP: dense weights whole on every GPU); TP: 2 all-reduces per
    layer of the replica's tokens x hidden over a ranks; EP: 2 all-to-alls per MoE layer of the
    GPU's tokens x top-k x hidden.
    """
    a, replicas = _attention_split(tp, ep)
    dense = model.weight_bytes - model.expert_bytes
    experts = touched_weight_bytes(model, tokens) - dense
    compute = flops / (tp * gpu.bf16_flops * _matmul_eff(gpu, eff))
    memory = (dense * (tp / a) + experts + kv_bytes) / (tp * gpu.hbm_bytes_per_s * _memory_eff(gpu, eff))
    msg = tokens / replicas * model.hidden * model.bytes_per_param
    comm = 2 * model.layers * allreduce_seconds(msg, a, gpu.link_bytes_per_s, eff)
    if model.moe is not None:
        routed = tokens / replicas * model.moe.experts_per_token * model.hidden * model.bytes_per_param
        comm = comm + 2 * model.moe_layers * alltoall_seconds(routed, ep, gpu.link_bytes_per_s, eff)
    return roof_seconds(compute, memory, eff), comm


def decode_seconds(
    gpu: GpuType, model: ModelSpec, tp: ArrayLike, batch: ArrayLike, context: ArrayLike, eff: Efficiency,
    ep: ArrayLike = 1,
) -> Array:
    """One decode iteration of an engine: B sequences at mean context L, TP t (EP: see above).

    roof(compute, memory) + TP all-reduces (+ EP all-to-alls) + an overhead (fixed + per running
    sequence), where
    compute = (2 P B + 4 layers B L attn_dim) / (t F e_mm)  (matmuls + attention scores/values)
    memory  = (W_touched(B) + B L kv) / (t BW e_mem)         (stream weights and the KV cache once)
    TP: 2 all-reduces per layer of B x hidden activations over the intra-node link.
    """
    t, b, ctx, e = _f(tp), _f(batch), _f(context), _f(ep)
    flops = 2 * model.compute_params * b + 4 * model.layers * b * ctx * model.attn_dim
    roof, comm = _engine_pass_seconds(gpu, model, t, e, b, flops, b * ctx * model.kv_bytes_per_token, eff)
    return roof + comm + eff.decode_overhead_s + eff.decode_overhead_per_seq_s * b


def prefill_seconds(
    gpu: GpuType, model: ModelSpec, tp: ArrayLike, tokens: ArrayLike, context: ArrayLike, eff: Efficiency,
    ep: ArrayLike = 1, prefix: ArrayLike = 0.0,
) -> Array:
    """Prefill T tokens of sequences about L long: 2 P T + causal attention 2 layers T L attn_dim FLOPs.

    The weights the tokens touch are read once per pass (memory floor); TP adds 2 all-reduces per
    layer of T x hidden (EP: all-to-alls, as decode_seconds). A `prefix` of K tokens already cached per
    sequence (vLLM's automatic prefix caching: the new tokens attend to the cached KV blocks too) adds
    4 layers T K attn_dim FLOPs (every new token over every cached key, as a decode query) and reads
    the T / L sequences' K cached tokens of KV once.
    """
    t, n, ctx, e, k = _f(tp), _f(tokens), _f(context), _f(ep), _f(prefix)
    flops = 2 * model.compute_params * n + 2 * model.layers * n * ctx * model.attn_dim
    flops = flops + 4 * model.layers * n * k * model.attn_dim
    cached = n / np.maximum(ctx, 1.0) * k * model.kv_bytes_per_token
    roof, comm = _engine_pass_seconds(gpu, model, t, e, n, flops, cached, eff)
    return roof + comm + eff.prefill_overhead_s


def engine_weight_bytes_per_gpu(model: ModelSpec, tp: ArrayLike, ep: ArrayLike = 1) -> Array:
    """Weights one GPU of an engine holds: dense weights over the attention TP, experts over all t."""
    t, e = _f(tp), _f(ep)
    a, _ = _attention_split(t, e)
    return (model.weight_bytes - model.expert_bytes) / a + model.expert_bytes / t


def kv_capacity_tokens(gpu: GpuType, model: ModelSpec, tp: ArrayLike, eff: Efficiency, ep: ArrayLike = 1,
                       resident_bytes: float = 0.0) -> Array:
    """Tokens of KV cache an engine of TP t can hold: r (min(f HBM, HBM - resident) - reserve - W_gpu) / (kv / a').

    vLLM's share f (gpu_memory_utilization) is of the whole GPU, per instance: it requests f x total
    memory and gives the KV cache that less its weights and profiled activations, whatever other
    processes hold (github.com/vllm-project/vllm @35d5cda, vllm/v1/worker/gpu_worker.py,
    init_device / determine_available_memory; the engine-args docs: "a per-instance limit").
    `resident_bytes` per GPU (a colocated trainer's states kept in HBM) therefore only bind once
    they leave less than f x HBM free: vLLM then refuses to start ("Free memory on device ... is
    less than desired GPU memory utilization"), and the share a user can set is what is free.
    With a attention TP ways over r replicas (r = 1, a = t without EP), each GPU holds kv / a of a
    token, or kv / kv_shards once a exceeds the KV heads (they are replicated; MLA's latent is not
    split at all).
    """
    t, e = _f(tp), _f(ep)
    a, replicas = _attention_split(t, e)
    share = min(gpu.hbm_bytes * eff.engine_memory_fraction, gpu.hbm_bytes - resident_bytes)
    free_per_gpu = share - eff.engine_reserve_bytes - engine_weight_bytes_per_gpu(model, t, e)
    kv_per_gpu_per_token = model.kv_bytes_per_token * np.maximum(1 / a, 1 / model.kv_shards)
    return replicas * np.maximum(free_per_gpu, 0.0) / kv_per_gpu_per_token


def train_flops_per_token(model: ModelSpec, seq_len: ArrayLike) -> Array:
    """Model FLOPs per trained token, the MFU convention of Megatron/torchtitan:
    6 P (forward + backward matmuls) + 12 layers s attn_dim (attention, no causal discount)."""
    return 6.0 * model.compute_params + 12.0 * model.layers * _f(seq_len) * model.attn_dim


def _recompute_flops_per_token(model: ModelSpec, seq_len: Array, recompute: str) -> Array:
    if recompute == "full":  # the whole forward again
        return 2.0 * model.compute_params + 4.0 * model.layers * seq_len * model.attn_dim
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
    ep: ArrayLike = 1,
    last_stage_layers: ArrayLike | None = None,
    lora_rank: int = 0,
    kernels: str = "fused",
) -> Array:
    """One optimizer step over N tokens on dp x tp x pp GPUs (or one forward pass if forward_only).

    compute = flops N / (dp tp pp F e_train fill) x imbalance x pipeline bubble (1 + (pp-1)/(m v)),
        fill = mb / (mb + half): a micro-batch of mb tokens fills the GPU less when small,
        imbalance = the slowest stage over the mean one (pipeline.stage_imbalance: the LM head and
        loss on the last stage; `last_stage_layers` decoder layers there, layers/pp by default)
    TP: 4 all-reduces per layer (2 forward, 2 backward) of the rank's tokens x hidden.
    DP: all-reduce of gradients 2(dp-1)/dp W/(tp pp) (+ parameter all-gathers under ZeRO-3),
        a share `comm_overlap` hidden behind compute (never less than what compute cannot hide);
        with EP the expert part is 2(edp-1)/edp W_experts/(ep pp) over edp = dp tp / ep ranks.
    EP: the all-to-alls of experts.train_alltoall_seconds, exposed.
    LoRA (`lora_rank` > 0, traces.lora): the frozen base has no weight-gradient pass and no gradients
    to reduce (ZeRO-3 still gathers it for the forward and the backward); the adapter adds its own; a
    forward pass (forward_only) runs the adapter too.
    `kernels` 'eager': the HBM traffic of the ops outside the GEMMs (costmodel.elementwise) adds to compute.
    """
    d, t, p, n = _f(dp), _f(tp), _f(pp), _f(tokens)
    s, mb = _f(seq_len), _f(microbatch_tokens)
    gpus = d * t * p
    lora = lora_rank > 0 and not forward_only
    if forward_only:
        per_token = 2.0 * model.compute_params + 4.0 * model.layers * s * model.attn_dim
    else:
        per_token = train_flops_per_token(model, s) + _recompute_flops_per_token(model, s, recompute)
    # LoRA: no weight-gradient GEMMs for the frozen base; the adapter's forward (and backward) are its own
    per_token = per_token + flops_per_token_change(model, lora_rank, forward_only=forward_only)
    # routed experts run below the dense matmul rate (Efficiency.expert_matmul): their extra time as FLOPs
    matmul_passes = 1.0 if forward_only else (2.0 if lora else 3.0) + (1.0 if recompute == "full" else 0.0)
    per_token = per_token + routed_flops_per_token(model, matmul_passes) * (1 / expert_train_matmul(eff) - 1)
    fill = mb / (mb + eff.train_half_tokens)  # small micro-batches leave the GPU part idle
    compute = per_token * n / (gpus * gpu.bf16_flops * (gpu.matmul_ceiling * eff.train_matmul) * fill)
    # the pipeline runs at its slowest stage: the last one, which also holds the LM head and the loss
    compute = compute * stage_imbalance(model, p, per_token, forward_only=forward_only,
                                        last_stage_layers=last_stage_layers, frozen=lora)
    microbatches = np.maximum(np.ceil(n / d / mb), 1.0)
    # a fixed cost per MoE layer of the stage, per pass and micro-batch (Efficiency.moe_layer_overhead_s)
    compute = compute + microbatches * matmul_passes * (model.moe_layers / p) * eff.moe_layer_overhead_s
    # an eager trainer's norms, activations and loss head stream HBM between the GEMMs (costmodel.elementwise)
    elementwise = pass_bytes_per_token(model, kernels, forward_only=forward_only, recompute=recompute,
                                       lora_rank=lora_rank)
    compute = compute + elementwise * n / (gpus * gpu.hbm_bytes_per_s * _memory_eff(gpu, eff))
    compute = compute * (1 + (p - 1) / (microbatches * virtual_stages))

    passes = 1 if forward_only else 2  # forward (+ backward): all-reduces per layer each
    rank_tokens = n / d
    tp_msg = rank_tokens * model.hidden * model.bytes_per_param
    tp_comm = passes * 2 * (model.layers / p) * allreduce_seconds(tp_msg, t, gpu.link_bytes_per_s, eff)

    e = _f(ep)
    ways = expert_ways(t, e)
    edp = d * t / ways  # ranks holding the same experts (dp without EP)
    shard_bytes = (model.weight_bytes - model.expert_bytes) / (t * p)
    expert_shard = model.expert_bytes / (ways * p)
    # Forward: ZeRO-3 gathers parameters once. Step: reduce-scatter + all-gather of gradients,
    # plus ZeRO-3's second parameter gather in the backward pass.
    gathers = 1.0 if zero_stage == 3 else 0.0
    # LoRA: the frozen base is gathered for the forward and again for the backward, never reduced
    volume = gathers if forward_only else 2.0 * gathers if lora else 2.0 + gathers
    dp_bw = _dp_bandwidth(gpu, t, p, d, gpus_per_node, inter_node_bytes_per_s)
    dp_comm = np.where(d > 1, volume * (d - 1) / d * shard_bytes / dp_bw, 0.0)
    dp_comm = dp_comm + np.where(edp > 1, volume * (edp - 1) / edp * expert_shard / dp_bw, 0.0)
    if lora:  # the adapter's gradients: an all-reduce over all data-parallel ranks
        dp_comm = dp_comm + np.where(d > 1, 2.0 * (d - 1) / d * adapter_bytes(model, lora_rank) / (t * p) / dp_bw, 0.0)
    exposed = np.maximum((1 - eff.comm_overlap) * dp_comm, dp_comm - compute)
    a2a_passes = 1.0 if forward_only else 2.0 + (1.0 if recompute == "full" else 0.0)
    a2a = train_alltoall_seconds(model, d, t, p, e, n, eff, passes=a2a_passes, link_bytes_per_s=gpu.link_bytes_per_s,
                                 gpus_per_node=gpus_per_node, inter_node_bytes_per_s=inter_node_bytes_per_s)
    return compute + tp_comm + exposed + a2a


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
    ep: ArrayLike = 1,
    lora_rank: int = 0,
) -> Array:
    """Peak bytes per GPU of mixed-precision Adam training: states (train_state_bytes) + activations.

    Activations per layer per token (Korthikanti et al. 2022, flash attention, sequence parallel):
    34 h / t bytes; 'none' adds the 5 a s attention-score term, 'full' keeps only the 2 h input.
    A 1F1B first stage holds pp microbatches of layers/pp layers. Logits: bf16 T x V / t.
    """
    t = _f(tp)
    p = _f(pp)
    mb, s = _f(microbatch_tokens), _f(seq_len)
    states = train_state_bytes(model, dp, tp, pp, zero_stage=zero_stage, ep=ep, lora_rank=lora_rank)
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


def train_state_bytes(model: ModelSpec, dp: ArrayLike, tp: ArrayLike, pp: ArrayLike, *, zero_stage: int = 3,
                      ep: ArrayLike = 1, lora_rank: int = 0) -> Array:
    """Bytes per GPU of weights, gradients and Adam states (ZeRO paper, Rajbhandari et al. 2020).

    2 (bf16 weights) + 2 (grads) + 12 (fp32 master, m, v) bytes/param over tp pp; ZeRO stage
    1/2/3 shards the optimizer / +grads / +weights over dp. Routed experts (all of them, not only
    the active ones) split over experts.expert_ways instead of tp, and ZeRO over dp tp / ways.
    LoRA: the frozen base holds its bf16 weights only; the adapter all three (traces.lora).
    """
    weights, grads, optim = train_state_parts(model, dp, tp, pp, zero_stage=zero_stage, ep=ep, lora_rank=lora_rank)
    return weights + grads + optim


def train_state_parts(model: ModelSpec, dp: ArrayLike, tp: ArrayLike, pp: ArrayLike, *, zero_stage: int = 3,
                      ep: ArrayLike = 1, lora_rank: int = 0) -> tuple[Array, Array, Array]:
    """(weights, gradients, optimizer states) bytes per GPU, as train_state_bytes sums them."""
    d, t, p = _f(dp), _f(tp), _f(pp)
    ways = expert_ways(t, ep)
    dense = _sharded_states(model.params - model.expert_params, t * p, d, zero_stage)
    experts = _sharded_states(model.expert_params, ways * p, d * t / ways, zero_stage)
    weights = dense[0] + experts[0]
    if lora_rank > 0:  # frozen base: its weights only; the adapter (sharded as the dense part) trains
        adapter = _sharded_states(adapter_params(model, lora_rank), t * p, d, zero_stage)
        return weights + adapter[0], adapter[1], adapter[2]
    return weights, dense[1] + experts[1], dense[2] + experts[2]


def _sharded_states(params: float, model_ways: Array, zero_ways: Array, zero_stage: int
                    ) -> tuple[Array, Array, Array]:
    per_param = params / model_ways
    weights, grads, optim = 2.0 * per_param, 2.0 * per_param, 12.0 * per_param
    if zero_stage >= 1:
        optim = optim / zero_ways
    if zero_stage >= 2:
        grads = grads / zero_ways
    if zero_stage >= 3:
        weights = weights / zero_ways
    return weights, grads, optim


def colocate_switch_seconds(
    gpu: GpuType, model: ModelSpec, engine_tp: ArrayLike, dp: ArrayLike, tp: ArrayLike, pp: ArrayLike,
    eff: Efficiency, *, zero_stage: int = 3, ep: ArrayLike = 1,
    offload: tuple[bool, bool, bool] = (True, True, True), engine_sleep: int = 1, lora_rank: int = 0,
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
        trainer = train_state_bytes(model, dp, tp, pp, zero_stage=zero_stage, ep=ep, lora_rank=lora_rank)
    else:
        parts = train_state_parts(model, dp, tp, pp, zero_stage=zero_stage, ep=ep, lora_rank=lora_rank)
        trainer = sum((part for part, moved in zip(parts, offload, strict=True) if moved), np.zeros_like(parts[0]))
    fixed = eff.switch_fixed_s if engine_sleep else 0.0
    return fixed + np.maximum(engine, trainer) / (gpu.host_bytes_per_s * eff.host_copy)


def sync_seconds(model: ModelSpec, engines: ArrayLike, path_bytes_per_s: ArrayLike, eff: Efficiency,
                 lora_rank: int = 0) -> Array:
    """Broadcast the weights from trainer rank 0 to K engines.

    fixed + n_tensors x per-tensor latency + W / bw, and a chunked tree broadcast adds one chunk
    time per extra tree level (ceil(log2(K+1)) levels). LoRA sends the adapter alone (traces.lora).
    """
    k, bw = _f(engines), _f(path_bytes_per_s)
    size = adapter_bytes(model, lora_rank) if lora_rank > 0 else model.weight_bytes
    tensors = adapter_tensors(model) if lora_rank > 0 else model.n_tensors
    chunk = np.minimum(size, 256e6)
    levels = np.ceil(np.log2(k + 1))
    transfer = size / bw + (levels - 1) * chunk / bw
    return eff.sync_fixed_s + tensors * eff.sync_per_tensor_s + transfer
