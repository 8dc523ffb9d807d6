"""fp8 calibration rows are priced at the measured fp8 share of the fp8 peak (sim.calibration_set)."""

from __future__ import annotations

from sim.calibration_set import FP8_MATMUL_CEILING, _precision
from traces import get_gpu, get_model
from traces.calibration import load_calibration

ROWS = {r.id: r for r in load_calibration()}


def test_h100_fp8_row_runs_at_its_measured_fp8_ceiling_not_the_bf16_one() -> None:
    row = ROWS["C18"]  # TensorRT-LLM fp8 prefill on H100
    assert row.precision == "fp8"
    h100 = get_gpu("H100")
    model, gpu = _precision(row, get_model("llama-2-7b"), h100)
    assert gpu.bf16_tflops == 2 * h100.bf16_tflops and model.bytes_per_param == 1.0
    assert gpu.matmul_ceiling == FP8_MATMUL_CEILING["H100"] < h100.matmul_ceiling


def test_unmeasured_gpu_keeps_its_bf16_ceiling_and_bf16_rows_are_untouched() -> None:
    l40s = get_gpu("L40S")
    _, gpu = _precision(ROWS["C19"], get_model("llama-2-7b"), l40s)  # fp8 on L40S: no fp8 MAMF row
    assert gpu.matmul_ceiling == l40s.matmul_ceiling
    h100 = get_gpu("H100")
    assert _precision(ROWS["K5"], get_model("gpt3-175b"), h100)[1] is h100
