"""Engine kinds: a scheduler-free CUDA-graph loop (gpt-fast) has its own fixed decode cost."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from sim.calibration_set import SOURCE_HBM_TB_PER_S, Skipped, case
from traces import CostModel, get_gpu, get_model
from traces.calibration import load_calibration
from traces.costmodel import DEFAULT_EFFICIENCY
from traces.costmodel.engine_kinds import engine_efficiency, is_graph_loop


def test_gpt_fast_is_a_graph_loop_and_serving_engines_are_not() -> None:
    assert is_graph_loop("gpt-fast (PyTorch, torch.compile)")
    assert is_graph_loop("  GPT-FAST")
    for engine in ("vLLM 0.6.0", "LMDeploy v0.1.0a1 (TurboMind)", "TensorRT-LLM 0.6.1 static batching", "SGLang"):
        assert not is_graph_loop(engine)
        assert engine_efficiency(DEFAULT_EFFICIENCY, engine) is DEFAULT_EFFICIENCY


def test_graph_loop_efficiency_swaps_only_the_decode_overheads() -> None:
    eff = replace(DEFAULT_EFFICIENCY, graph_loop_decode_overhead_s=3e-4)
    loop = engine_efficiency(eff, "gpt-fast")
    assert loop.decode_overhead_s == 3e-4 and loop.decode_overhead_per_seq_s == 0.0
    assert replace(loop, decode_overhead_s=eff.decode_overhead_s,
                   decode_overhead_per_seq_s=eff.decode_overhead_per_seq_s) == eff
    gpu, model = get_gpu("A100-80G"), get_model("llama-2-7b")
    served = CostModel.roofline_only(eff).decode(gpu, model, 1, 1, 100).seconds
    looped = CostModel.roofline_only(loop).decode(gpu, model, 1, 1, 100).seconds
    assert np.allclose(served - looped, eff.decode_overhead_s + eff.decode_overhead_per_seq_s - 3e-4)


def test_gpt_fast_rows_are_priced_on_their_power_limited_gpus() -> None:
    """gpt-fast's A100s ran at 330 W (about 1700 GB/s, its README): its rows are slower than on the
    catalog's A100-80G."""
    rows = {r.id: r for r in load_calibration()}
    cm = CostModel.roofline_only()
    assert SOURCE_HBM_TB_PER_S["gpt-fast"] < get_gpu("A100-80G").hbm_tb_per_s
    c9 = case(rows["C9"])
    at_catalog = case(rows["C9"].model_copy(update={"source_key": "gpt-fast-at-catalog-rate"}))
    assert not isinstance(c9, Skipped) and not isinstance(at_catalog, Skipped)
    assert c9.predict(cm) < at_catalog.predict(cm)
