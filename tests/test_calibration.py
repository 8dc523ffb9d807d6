"""Each calibration row of ../shared/calibration.md that the cost model was fitted to.

Tolerances from the foundation issue: throughput rows within 20%, MFU rows within 15% (relative),
weight sync within 2x of the published range; the simulated RL step (K6) within 25%.
Assumptions are in tests/calibration_cases.py.
"""

from __future__ import annotations

import pytest
from calibration_cases import (
    k1_k2_sharegpt_tokens_per_s,
    k3_static_batch_tokens_per_s,
    k4_torchtitan_mfu,
    k5_megatron_mfu,
    k6_nemo_rl_colocated_step,
    k7_refit_seconds,
)

from traces.costmodel import CostModel


@pytest.fixture(scope="module")
def cm() -> CostModel:
    return CostModel.roofline_only()


def test_k1_vllm_sharegpt_a100(cm: CostModel) -> None:
    """K1: vLLM 0.6.0, llama-3.1-8b, A100-80G, ShareGPT 5000 prompts: 4132 output tok/s."""
    assert k1_k2_sharegpt_tokens_per_s(cm) == pytest.approx(4132, rel=0.20)


def test_k2_sglang_sharegpt_a100(cm: CostModel) -> None:
    """K2: SGLang 0.3.0, same setup as K1: 4282 output tok/s."""
    assert k1_k2_sharegpt_tokens_per_s(cm) == pytest.approx(4282, rel=0.20)


def test_k3_trtllm_static_batch(cm: CostModel) -> None:
    """K3: TensorRT-LLM, llama-2-7b, A100, batch 384, 128 in / 128 out: 5586 output tok/s."""
    assert k3_static_batch_tokens_per_s(cm) == pytest.approx(5586, rel=0.20)


def test_k4_torchtitan_fsdp_mfu(cm: CostModel) -> None:
    """K4: torchtitan FSDP2, llama3-8b, 64 A100, seq 8192, selective AC: 58.2% MFU."""
    assert k4_torchtitan_mfu(cm) == pytest.approx(0.582, rel=0.15)


@pytest.mark.parametrize(("gpus", "mfu"), [(96, 0.47), (4608, 0.42)])
def test_k5_megatron_gpt3_mfu(cm: CostModel, gpus: int, mfu: float) -> None:
    """K5: Megatron-Core GPT-3 175B on H100: 47% MFU at 96 GPUs falling to 42% at 4608."""
    assert k5_megatron_mfu(cm, gpus) == pytest.approx(mfu, rel=0.15)


def test_k5_mfu_falls_with_scale(cm: CostModel) -> None:
    """K5's trend: more GPUs at a fixed global batch means fewer micro-batches, a larger bubble."""
    assert k5_megatron_mfu(cm, 4608) < k5_megatron_mfu(cm, 96)


@pytest.mark.xfail(strict=True, reason="known miss since the kernel refit (bench/fidelity.py): the simulated step "
                   "is ~30% faster than NeMo-RL's 92.8 s; the RL step lacks mechanisms (training at small "
                   "micro-batches, the engines' sleep/wake) that no calibration row isolates yet (issue 20)")
@pytest.mark.parametrize("sigma", [0.5, 0.7, 1.0])
def test_k6_nemo_rl_colocated_grpo_step(sigma: float) -> None:
    """K6: NeMo-RL colocated GRPO, llama-3.1-8b, 16 H100: 92.8 s/step, simulated within 25%.

    The response-length spread is not in the row; the result holds across plausible spreads.
    """
    assert k6_nemo_rl_colocated_step(sigma) == pytest.approx(92.8, rel=0.25)


def test_k7_nemo_rl_refit(cm: CostModel) -> None:
    """K7: NeMo-RL NCCL refit of qwen3-4b, 8x H100 trainer to TP8 vLLM: 0.21-0.34 s."""
    seconds = k7_refit_seconds(cm)
    assert 0.21 / 2 <= seconds <= 0.34 * 2


def test_k8_hopper_matmul_ceiling() -> None:
    """K8: an 8192^3 bf16 matmul reaches ~790 of 989 TFLOP/s on H200: the Hopper ceiling."""
    from traces import get_gpu

    gpu = get_gpu("H200")
    assert gpu.bf16_flops * gpu.matmul_ceiling == pytest.approx(790e12, rel=0.02)

