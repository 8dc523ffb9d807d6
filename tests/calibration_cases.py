"""The K rows of ../shared/calibration.md as tests/test_calibration.py checks them: each is the
calibration set's own prediction (sim.calibration_set, where every assumption is written down)."""

from __future__ import annotations

from sim.calibration_set import case, k6_step
from traces.calibration import load_calibration
from traces.costmodel import CostModel
from traces.costmodel.fit import Case

ROWS = {row.id: row for row in load_calibration()}


def _predict(row_id: str, cm: CostModel) -> float:
    c = case(ROWS[row_id])
    assert isinstance(c, Case), c
    return c.predict(cm)


def k1_k2_sharegpt_tokens_per_s(cm: CostModel) -> float:
    """K1/K2: llama-3.1-8b, 1x A100-80G, TP1, ShareGPT, 5000 prompts at once (the two share a setup)."""
    return _predict("K1", cm)


def k3_static_batch_tokens_per_s(cm: CostModel) -> float:
    """K3: llama-2-7b, 1x A100, static batch 384, 128 prompt + 128 output tokens."""
    return _predict("K3", cm)


def k4_torchtitan_mfu(cm: CostModel) -> float:
    """K4: llama-3-8b, 64x A100-80G, FSDP2, local batch 1 x 8192 tokens, selective recomputation."""
    return _predict("K4", cm)


def k5_megatron_mfu(cm: CostModel, gpus: int) -> float:
    """K5: GPT-3 175B on H100 with Megatron-Core at 96 GPUs (K5) or 4608 (its second figure, C24)."""
    return _predict({96: "K5", 4608: "C24"}[gpus], cm)


def k7_refit_seconds(cm: CostModel) -> float:
    """K7: qwen3-4b weights from an 8x H100 trainer to a TP8 vLLM engine on the same node (NVLink)."""
    return _predict("K7", cm)


def k6_nemo_rl_colocated_step(sigma: float = 0.7, steps: int = 6) -> float:
    """K6: NeMo-RL colocated GRPO step, simulated with the roofline alone (sim.calibration_set.k6_step)."""
    return k6_step(CostModel.roofline_only(), sigma, steps)
