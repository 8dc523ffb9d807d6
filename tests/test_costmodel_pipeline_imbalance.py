"""The last pipeline stage holds the LM head and the loss and sets the pipeline's pace (traces.costmodel.pipeline)."""

from __future__ import annotations

import pytest

from traces import CostModel
from traces.costmodel import DEFAULT_EFFICIENCY
from traces.costmodel.pipeline import head_flops_per_token, stage_imbalance
from traces.costmodel.roofline import train_flops_per_token
from traces.hardware import get_gpu
from traces.models import get_model

SEQ = 4096


def _train_s(model: str, pp: int, **kw: object) -> float:
    cm = CostModel.roofline_only(DEFAULT_EFFICIENCY)
    m = get_model(model)
    # dp 1, tp 1: no gradient or TP traffic, only compute, so time ratios are compute ratios
    return float(cm.train(get_gpu("H100"), m, 1, 1, pp, 64 * SEQ, seq_len=SEQ, microbatch_tokens=SEQ,
                          recompute="none", **kw).seconds)


def test_even_split_last_stage_carries_the_head() -> None:
    """gpt-oss-120b (vocab 201k x hidden 2880: a head worth about 5 of its 36 thin layers) on PP4, Megatron's
    even split: the last rank runs 9 layers + the head, against a mean of (36 layers + head) / 4."""
    m = get_model("gpt-oss-120b")
    total = float(train_flops_per_token(m, SEQ))
    head = head_flops_per_token(m)
    layer = (total - head) / m.layers
    expected = (9 * layer + head) / (total / 4)
    got = float(stage_imbalance(m, 4, total))
    assert got == pytest.approx(expected, rel=1e-9)
    assert 1.2 < got < 1.35  # the head is ~9% of the model's FLOPs, all of it on one of 4 stages


def test_train_step_slows_by_the_imbalance_and_pp1_is_untouched() -> None:
    """A dense model (its step is compute alone at dp 1, tp 1): the even split's step over a balanced one's
    is the imbalance itself."""
    m = get_model("llama-3.1-8b")
    total = float(train_flops_per_token(m, SEQ))
    # a split that puts layers/pp on the last stage (the default) against one that balances it
    head_layers = head_flops_per_token(m) / ((total - head_flops_per_token(m)) / m.layers)
    balanced = (m.layers - 3 * head_layers) / 4  # last: balanced + head = every other rank's share
    assert float(stage_imbalance(m, 4, total, last_stage_layers=balanced)) == pytest.approx(1.0, abs=1e-9)
    even, fair = _train_s("llama-3.1-8b", 4), _train_s("llama-3.1-8b", 4, last_stage_layers=balanced)
    assert even / fair == pytest.approx(float(stage_imbalance(m, 4, total)), rel=1e-6)
    assert even / fair > 1.15  # its 128k x 4096 head is a sixth of a 4-stage share
    assert _train_s("llama-3.1-8b", 1, last_stage_layers=3) == _train_s("llama-3.1-8b", 1)


def test_accounting_for_the_loss_shrinks_the_imbalance() -> None:
    """Llama 3 405B takes one layer off the last stage (arXiv:2407.21783 sec. 3.3.2): PP16 runs within 1% of
    balanced; the even split would leave its last stage 7% over the mean."""
    m = get_model("llama-3.1-405b")
    total = float(train_flops_per_token(m, SEQ))
    assert float(stage_imbalance(m, 16, total, last_stage_layers=7)) < 1.01
    assert 1.05 < float(stage_imbalance(m, 16, total)) < 1.10
    assert _train_s("llama-3.1-405b", 16, last_stage_layers=7) < _train_s("llama-3.1-405b", 16)


def test_deeper_pipelines_and_bigger_vocabularies_weigh_more() -> None:
    m = get_model("llama-3.1-8b")
    total = float(train_flops_per_token(m, SEQ))
    shares = [float(stage_imbalance(m, p, total)) for p in (2, 4, 8)]
    assert shares == sorted(shares) and shares[0] > 1.0
    big = m.model_copy(update={"vocab": 4 * m.vocab})
    assert float(stage_imbalance(big, 4, float(train_flops_per_token(big, SEQ)))) > shares[1]
