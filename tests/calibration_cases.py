"""Predictions for the calibration rows of ../shared/calibration.md, with the assumptions each needs.

Shared by tests/test_calibration.py and the README's calibration table; these rows (and only
these) were used to fit traces/costmodel/efficiency.py.
"""

from __future__ import annotations

import math

import numpy as np

from traces import get_gpu, get_model
from traces.costmodel import CostModel


def k1_k2_sharegpt_tokens_per_s(cm: CostModel) -> float:
    """K1/K2: llama-3.1-8b, 1x A100-80G, TP1, ShareGPT, 5000 prompts at once.

    Assumptions: mean response 194 tokens (the row's 4132 output tok/s / 21.27 req/s); ShareGPT
    prompts ~240 tokens on average; lengths lognormal with sigma 1.0 (E[o^2] = E[o]^2 e^{sigma^2});
    engine caps at vLLM's default 256 running sequences; steady state (drain tail ignored).
    """
    mean_out, sigma = 4132.37 / 21.27, 1.0
    rate = cm.generation_rate(
        get_gpu("A100-80G"), get_model("llama-3.1-8b"), 1,
        prompt_mean=240.0, response_mean=mean_out, response_sq_mean=mean_out**2 * math.exp(sigma**2),
    )
    return float(rate.tokens_per_s)


def k3_static_batch_tokens_per_s(cm: CostModel) -> float:
    """K3: llama-2-7b, 1x A100, static batch 384, 128 prompt + 128 output tokens.

    One prefill of 384 x 128 tokens, then 128 decode iterations at contexts 128..255.
    """
    gpu, model = get_gpu("A100-80G"), get_model("llama-2-7b")
    batch, n_in, n_out = 384, 128, 128
    prefill = float(cm.prefill(gpu, model, 1, batch * n_in, n_in).seconds)
    decode = cm.decode(gpu, model, 1, batch, n_in + np.arange(n_out)).seconds.sum()
    return batch * n_out / (prefill + decode)


def k4_torchtitan_mfu(cm: CostModel) -> float:
    """K4: llama-3-8b (= llama-3.1-8b shape), 64x A100-80G, FSDP2, local batch 1 x 8192 tokens,
    selective activation checkpointing. Assumption: 8 GPUs per node, 200 Gb/s per GPU between nodes."""
    gpu, model = get_gpu("A100-80G"), get_model("llama-3.1-8b")
    dp, seq = 64, 8192
    tokens = dp * seq
    t = float(cm.train(gpu, model, dp, 1, 1, tokens, seq_len=seq, microbatch_tokens=seq, zero_stage=3,
                       recompute="selective", inter_node_bytes_per_s=25e9).seconds)
    return _mfu(model, seq, tokens, t, dp, gpu.bf16_flops)


def k5_megatron_mfu(cm: CostModel, gpus: int) -> float:
    """K5: GPT-3 175B on H100 with Megatron-Core, seq 4096, 1152 sequences per batch.

    Assumptions (not in the row): TP 8 within a node, PP 12 (8 layers per stage), DP = GPUs / 96,
    micro-batch of 1 sequence, distributed optimizer (ZeRO-1), selective recomputation, an
    interleaved schedule with 4 virtual stages per rank, 400 Gb/s per GPU between nodes.
    """
    gpu, model = get_gpu("H100"), get_model("gpt3-175b")
    tp, pp, seq = 8, 12, 4096
    dp = gpus // (tp * pp)
    tokens = 1152 * seq
    t = float(cm.train(gpu, model, dp, tp, pp, tokens, seq_len=seq, microbatch_tokens=seq, zero_stage=1,
                       recompute="selective", virtual_stages=4, inter_node_bytes_per_s=50e9).seconds)
    return _mfu(model, seq, tokens, t, gpus, gpu.bf16_flops)


def k7_refit_seconds(cm: CostModel) -> float:
    """K7: qwen3-4b weights from an 8x H100 trainer to a TP8 vLLM engine on the same node (NVLink)."""
    gpu = get_gpu("H100")
    return float(cm.sync(gpu, get_model("qwen3-4b"), 1, gpu.link_bytes_per_s).seconds)


def _mfu(model, seq: int, tokens: int, seconds: float, gpus: int, peak: float) -> float:  # type: ignore[no-untyped-def]
    from traces.costmodel.roofline import train_flops_per_token

    return float(train_flops_per_token(model, seq)) * tokens / (seconds * gpus * peak)


def k6_nemo_rl_colocated_step(sigma: float = 0.7, steps: int = 6) -> float:
    """K6: NeMo-RL 0.5, llama-3.1-8b GRPO on 16 H100, colocated: simulated mean step seconds.

    Workload as the row gives it: 64 prompts x 32 generations, global batch 512 (4 PPO
    minibatches of the 2048 samples), max sequence 4096, mean generated length 1019.
    Assumptions (not in the row): prompts of 127 tokens (the row's 1581 tok/s/GPU x 16 x 92.8 s
    minus the generated tokens, over 2048 samples); responses lognormal with sigma 0.7 capped at
    4096 - 127; 2 nodes of 8 GPUs; 16 vLLM TP1 engines; Megatron trainer dp16 with the distributed
    optimizer (ZeRO-1), no recomputation; NeMo-RL's default KL penalty to a reference policy (one
    more logprob pass).
    """
    from sim import simulate
    from traces import Cluster, Plan, RolloutGroup, TrainerGroup, Workload

    cluster = Cluster(name="h100-16", node_groups=({"gpu_type": "H100", "nodes": 2, "gpus_per_node": 8},))
    workload = Workload(
        name="k6", model=get_model("llama-3.1-8b"), prompts_per_step=64, group_size=32,
        prompt_len={"kind": "fixed", "value": 127},
        response_len={"kind": "lognormal", "mean": 1019, "sigma": sigma, "cap": 4096 - 127},
        mode="colocated", ppo_minibatches=2048 // 512, kl_reference=True,
    )
    plan = Plan(mode="colocated", rollout=(RolloutGroup(gpu_type="H100", tp=1, instances=16),),
                trainer=TrainerGroup(gpu_type="H100", dp=16, zero_stage=1, recompute="none"))
    return simulate(cluster, workload, plan, CostModel.roofline_only(), steps=steps, seed=0).mean_step_s
