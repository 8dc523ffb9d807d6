"""Fitted efficiency factors of the roofline, with the calibration rows they came from.

matmul, memory, decode_overhead_s, decode_overhead_per_seq_s, prefill_overhead_s, train_matmul,
collective_latency_s and sync_fixed_s were fitted together by `bench/fidelity.py --quick --fields
...` (2026-12-01) to the 31 rows of traces/data/calibration (8 sources; K1-K7 of
../shared/calibration.md among them) that rlfleet can describe: robust log loss, bounded
(traces.costmodel.fit). Their leave-one-source-out errors are in the README. The other fields are
set as their comments say. tests/test_calibration.py checks the K rows.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Efficiency:
    # Fraction of the GPU's achievable matmul rate (peak x GpuType.matmul_ceiling) that serving
    # GEMMs reach (prefill and decode). Fitted jointly to K1/K2 (vLLM/SGLang on ShareGPT, A100)
    # and K3 (TensorRT-LLM static batch, A100) by a grid search (tests/calibration_cases.py).
    matmul: float = 0.637
    # Fraction of HBM bandwidth that decode reaches while streaming weights and KV (K1-K3;
    # K9's ~90% copy rate is the ceiling).
    memory: float = 0.882
    # Fixed cost per decode iteration (scheduling, kernel launches; CUDA graphs shrink it), seconds (K1/K2),
    # and the part that grows with the running batch (sampling, detokenising, scheduler bookkeeping
    # per sequence), seconds per sequence.
    decode_overhead_s: float = 0.00217
    decode_overhead_per_seq_s: float = 4.52e-5
    # Fixed cost per decode iteration of a scheduler-free CUDA-graph loop (gpt-fast; engine_kinds.py),
    # seconds: fitted to gpt-fast's rows (C9, C10, C50-C52, C62-C66; the others at these values, and in
    # bench/fidelity.py --quick's joint fit alike) it sits on its floor, BOUNDS' 0.1 ms: a graph replay.
    graph_loop_decode_overhead_s: float = 1e-4
    # How a pass's compute and memory times combine: 0 takes the larger (the plain roofline); p > 0
    # takes (compute^p + memory^p)^(1/p), which lies between the sum (p = 1) and the larger one, and
    # costs most where the two are equal (the ridge: a short prefill, decode at batch 32-128), where
    # kernels do not stream HBM and fill the tensor cores at the same time. Off in the shipped
    # profile; bench/fidelity.py fits it (rows C15 and C4 sit near the ridge).
    roofline_p: float = 0.0
    # Fixed cost per prefill forward pass (scheduling, launches: no CUDA graph for prefill), seconds.
    prefill_overhead_s: float = 0.0075
    # Fraction of the achievable matmul rate the training step reaches, non-matmul ops included.
    # Fitted to K4 (torchtitan FSDP, A100) and K5 (Megatron TP/PP, H100, with Hopper's K8 ceiling).
    train_matmul: float = 0.742
    # Share of the dense training matmul rate that routed-expert FLOPs reach (token permutation,
    # grouped GEMMs, router, load imbalance): the least-squares log error over C33/C34 (gpt-oss-120b,
    # Megatron-Bridge; C34 priced at its published micro-batch of 4 sequences). Refitted so 2026-12-03
    # (0.31 -> 0.42) once C34's last pipeline stage carries the LM head (traces.costmodel.pipeline) and
    # GB200 its measured matmul ceiling (traces/data/gpus.yaml): C33 +6.5%, C34 -6.9%, C35 (not in the
    # fit) -15.9%. One source only: held out, it is judged from the neutral start (1.0, no loss),
    # so its leave-one-source-out error shows what is not yet known.
    expert_matmul: float = 0.42
    # Fixed cost per MoE layer, per pass (forward, backward, recompute) and per micro-batch of a training
    # step, seconds: router, token permutation and the dispatch's host wait (DeepEP's normal kernels block
    # the CPU until the GPU reports how many tokens arrive, docs/legacy.md of github.com/deepseek-ai/DeepEP,
    # so the launches after it cannot run ahead). Off in the shipped profile, as roofline_p: bench/fidelity.py
    # fits it (with expert_matmul: 1.1e-3 s and 0.45 over every MoE training row, 2026-12-02). 0: no such cost.
    moe_layer_overhead_s: float = 0.0
    # Small micro-batches do not fill the GPU: the training matmul rate is scaled by
    # mb / (mb + train_half_tokens) for mb tokens per micro-batch (0: no such loss).
    train_half_tokens: float = 0.0
    # Share of data-parallel gradient/parameter traffic hidden behind compute (K4, K5).
    comm_overlap: float = 0.8
    # Latency of one collective call, seconds (TP all-reduces, per-tensor sync).
    collective_latency_s: float = 3.93e-5
    # Weight sync: fixed cost (pause engines, version bump) and cost per named tensor (K7).
    sync_fixed_s: float = 0.098
    sync_per_tensor_s: float = 4e-4
    # Engine memory: share of HBM the engine may use (vLLM's gpu_memory_utilization) and the
    # activation/workspace reserve per GPU.
    engine_memory_fraction: float = 0.9
    engine_reserve_bytes: float = 2e9
    # vLLM's default cap on running sequences per engine.
    max_num_seqs: int = 256
    # Prefill is chunked: tokens priced together per chunk (vLLM max_num_batched_tokens).
    prefill_chunk_tokens: int = 8192
    # Colocated hand-over (roofline.colocate_switch_seconds). Not fitted: no calibration row
    # isolates it. Pinned host copies reach about 80% of the PCIe peak; the fixed part (freeing
    # and re-allocating the KV cache, waking the engine) is an assumption of half a second.
    host_copy: float = 0.8
    switch_fixed_s: float = 0.5
    # Trainer memory reserve per GPU (CUDA context, NCCL buffers, fragmentation).
    train_reserve_bytes: float = 3e9


DEFAULT_EFFICIENCY = Efficiency()
