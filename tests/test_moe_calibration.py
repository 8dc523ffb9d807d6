"""The calibration set's mixture-of-experts rows, predicted as sim.calibration_set predicts every row.

Training throughput: gpt-oss-120b on GB200 and H100 (C33, C34; what Efficiency.expert_matmul was fitted
to) and DeepSeek-V3 on GB200 (C35, held out of that fit). Decode: Mixtral 8x7B at batch 1 with TP 2,
4 and 8 (gpt-fast, C50-C52), where the active weights set the pace.
"""

from __future__ import annotations

import dataclasses

import pytest

from sim.calibration_set import Skipped, case
from traces import CostModel
from traces.calibration import load_calibration
from traces.costmodel.fit import Case

ROWS = {r.id: r for r in load_calibration()}
CM = CostModel()


def _case(row_id: str) -> Case:
    c = case(ROWS[row_id])
    assert not isinstance(c, Skipped), c
    return c


@pytest.mark.parametrize("row_id", ["C33", "C34", "C35", "C50"])
def test_moe_rows_within_20_percent(row_id: str) -> None:
    assert abs(_case(row_id).error(CM)) < 0.20


@pytest.mark.parametrize("row_id", ["C51", "C52"])
def test_mixtral_tp4_tp8_miss_by_the_collective_latency_not_the_experts(row_id: str) -> None:
    """At TP 4 and 8 a batch-1 token takes 4-6 ms, and the fitted 39 us per all-reduce (64 of them a
    token) is too slow for gpt-fast's intra-node all-reduce: those rows fall 20-35% short. With the
    latency at 20 us (the refit's business: traces/costmodel/efficiency.py) they are within 20%; the
    dense TP8 row of the same source (C10) stays within 10% there too."""
    assert _case(row_id).error(CM) < -0.20
    faster = CostModel(CM.tables, dataclasses.replace(CM.efficiency, collective_latency_s=2e-5))
    assert abs(_case(row_id).error(faster)) < 0.20
    assert abs(_case("C10").error(CostModel.roofline_only(faster.efficiency))) < 0.10


def test_expert_matmul_held_out_is_judged_from_its_neutral_start() -> None:
    """The MoE training rows are the only ones expert_matmul reaches: refit without their source,
    it must stay at the start (a bounded fit would otherwise drift it) and predict them without it."""
    from dataclasses import replace

    from traces.costmodel import DEFAULT_EFFICIENCY
    from traces.costmodel.fit import fit, leave_one_source_out

    cases = [_case(i) for i in ("C9", "C33", "C34", "C35", "K4")]
    start = replace(DEFAULT_EFFICIENCY, expert_matmul=1.0)
    full, judged = leave_one_source_out(cases, ["train_matmul", "expert_matmul"], start=start)
    assert 0.1 < full.expert_matmul < 0.6  # fitted where the rows are seen
    dense = [c for c in cases if c.source != cases[1].source]
    held = CostModel(efficiency=fit(dense, ["train_matmul"], start=start))  # expert_matmul left at 1.0
    for j in judged:
        if j.case.source == cases[1].source:
            assert j.held_out_predicted == pytest.approx(j.case.predict(held), rel=1e-9), j.case.id
            assert j.held_out_error > 0.5  # no expert loss: far too fast, as it should be without the rows


def test_c34_is_priced_at_its_published_micro_batch() -> None:
    """Megatron-Bridge's H100 gpt-oss-120b row runs micro-batches of 4 sequences (its MBS column):
    fewer, larger micro-batches, so PP4's pipeline bubble is larger than at MBS 1."""
    row = ROWS["C34"]
    assert "MBS4" in row.layout
    mbs1 = case(row.model_copy(update={"layout": row.layout.replace("MBS4", "MBS1")}))
    assert not isinstance(mbs1, Skipped)
    assert _case("C34").predict(CM) < mbs1.predict(CM)
