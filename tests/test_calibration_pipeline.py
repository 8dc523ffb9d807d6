"""The Llama 3 405B rows (C25, C26) are priced at the interleaved schedule their paper describes."""

from __future__ import annotations

import math

from sim.calibration_set import _layout, case
from traces import CostModel
from traces.calibration import load_calibration
from traces.costmodel import DEFAULT_EFFICIENCY
from traces.costmodel.fit import Case

ROWS = {r.id: r for r in load_calibration()}


def test_llama3_rows_carry_the_papers_virtual_stages() -> None:
    """arXiv:2407.21783 sec. 3.3.2: V stages per rank, one layer per chunk after the rebalancing
    (126 layers + embedding + output = 128 units over PP16): VP8, and the notes say where it comes from."""
    for row_id in ("C25", "C26"):
        row = ROWS[row_id]
        assert _layout(row.layout)["pp"] == 16 and _layout(row.layout)["vp"] == 8
        assert "sec. 3.3.2" in row.notes


def test_llama3_bubble_follows_pp_minus_one_over_v_m() -> None:
    """The paper's bubble ratio (PP-1)/(V M): C26 has M = 2048 / 128 = 16 micro-batches per DP group, so VP8
    leaves 15/128 of bubble where VP1 left 15/16. One pipeline of the row's shape (no TP or DP traffic)
    takes (1 + 15/16) / (1 + 15/128) times as long without interleaving; and the row's prediction moves by
    at most that (its TP all-reduces are no part of the bubble)."""
    from traces import get_gpu, get_model

    row = ROWS["C26"]
    cm = CostModel.roofline_only(DEFAULT_EFFICIENCY)
    gpu, model = get_gpu("H100"), get_model("llama-3.1-405b")
    m = row.batch // _layout(row.layout)["dp"]
    assert m == 16

    def pipeline(v: int) -> float:
        return float(cm.train(gpu, model, 1, 1, 16, m * 8192, seq_len=8192, microbatch_tokens=8192, zero_stage=1,
                              virtual_stages=v).seconds)

    expected = (1 + 15 / 16) / (1 + 15 / 128)
    assert math.isclose(pipeline(1) / pipeline(8), expected, rel_tol=1e-9)
    interleaved = case(row)
    flat = case(row.model_copy(update={"layout": row.layout.replace(" VP8", "")}))
    assert isinstance(interleaved, Case) and isinstance(flat, Case)
    assert 1.3 < interleaved.predict(cm) / flat.predict(cm) <= expected
