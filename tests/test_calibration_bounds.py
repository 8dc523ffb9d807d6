"""Calibration rows that bound the prediction instead of measuring it (traces.costmodel.fit's Case.bound)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sim.calibration_set import case
from traces import CostModel, get_gpu, get_model
from traces.calibration import load_calibration
from traces.costmodel import DEFAULT_EFFICIENCY
from traces.costmodel.fit import Case, fit
from traces.errors import SpecError

START = replace(DEFAULT_EFFICIENCY, matmul=0.5, prefill_overhead_s=0.0)
GPU, MODEL = get_gpu("A100-80G"), get_model("llama-2-7b")


def _prefill(cm: CostModel) -> float:
    return float(cm.prefill(GPU, MODEL, 1, 8 * 2048, 2048).seconds)


def _at(matmul: float) -> float:
    return _prefill(CostModel.roofline_only(replace(START, matmul=matmul)))


def test_a_satisfied_upper_bound_does_not_move_the_fit() -> None:
    """The prediction at the start (matmul 0.5) is below a bound set at matmul 0.4's time: no pull."""
    bound = Case("b", "src", "prefill", _at(0.4), _prefill, bound="upper")
    point = Case("p", "src2", "prefill", _at(0.7), _prefill)
    assert fit([bound, point], ["matmul"], start=START).matmul == pytest.approx(0.7, rel=0.02)
    assert bound.miss(_at(0.5)) == 0.0


def test_a_crossed_upper_bound_pulls_the_prediction_under_it() -> None:
    """Predicted above the bound (matmul 0.5 is slower than 0.8's time), the fit speeds it up to (or past) the bound."""
    bound = Case("b", "src", "prefill", _at(0.8), _prefill, bound="upper")
    got = fit([bound], ["matmul"], start=START).matmul
    assert got > 0.79 and bound.miss(_at(got)) < 0.01
    assert bound.miss(_at(0.5)) == pytest.approx(_at(0.5) / _at(0.8) - 1)


def test_an_unknown_bound_is_refused() -> None:
    with pytest.raises(SpecError, match="bound"):
        Case("b", "src", "prefill", 1.0, _prefill, bound="lower")


def test_lmdeploy_max_first_token_rows_are_upper_bounds() -> None:
    rows = {r.id: r for r in load_calibration()}
    kinds = {i: case(rows[i]).bound for i in ("C20", "C21", "C22", "C23")}
    assert kinds == {"C20": "", "C21": "upper", "C22": "", "C23": "upper"}
