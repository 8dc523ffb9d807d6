"""traces.costmodel.fit: the prior towards the start values, as bench/fidelity.py uses it."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from traces import CostModel, get_gpu, get_model
from traces.costmodel import DEFAULT_EFFICIENCY
from traces.costmodel.fit import Case, fit

START = replace(DEFAULT_EFFICIENCY, matmul=0.5, prefill_overhead_s=0.0)
GPU, MODEL = get_gpu("A100-80G"), get_model("llama-2-7b")


def _prefill(cm: CostModel) -> float:
    """A compute-bound pass (8 prompts of 2048): its seconds move with matmul only."""
    return float(cm.prefill(GPU, MODEL, 1, 8 * 2048, 2048).seconds)


def _case_at(matmul: float) -> Case:
    """The pass as measured on a GPU whose matmul efficiency is `matmul`."""
    measured = _prefill(CostModel.roofline_only(replace(START, matmul=matmul)))
    return Case("x", "src", "prefill", measured, _prefill)


def test_without_a_prior_the_fit_reaches_the_measurement() -> None:
    got = fit([_case_at(0.75)], ["matmul"], start=START)
    assert got.matmul == pytest.approx(0.75, rel=0.01)


def test_the_prior_holds_a_field_towards_its_start_the_harder_the_heavier() -> None:
    """One row asks for matmul 0.75 from a start of 0.5: a light prior gives most of the way, a heavy
    one almost none; in between, the log distance to the start shrinks as the weight grows."""
    moved = [math.log(fit([_case_at(0.75)], ["matmul"], start=START, prior_weight=w).matmul / 0.5)
             for w in (0.0, 0.3, 3.0, 30.0)]
    assert moved == sorted(moved, reverse=True)
    assert moved[1] > 0.5 * math.log(1.5)  # 0.3, as bench/fidelity.py: the row still wins
    assert moved[3] < 0.1 * math.log(1.5)


def test_a_field_off_by_default_is_not_held() -> None:
    """train_half_tokens = 0 (no small-batch loss) has no value to hold: the prior leaves it free."""
    start = replace(START, train_half_tokens=0.0)
    gpu, model = get_gpu("H100"), get_model("llama-3.1-8b")

    def train(cm: CostModel) -> float:
        return float(cm.train(gpu, model, 8, 1, 1, 8 * 2048, seq_len=2048, microbatch_tokens=2048).seconds)

    measured = train(CostModel.roofline_only(replace(start, train_half_tokens=1024.0)))
    case = Case("t", "src", "train", measured, train)
    free = fit([case], ["train_half_tokens"], start=start, prior_weight=0.3)
    assert free.train_half_tokens == pytest.approx(1024.0, rel=0.02)
