"""vLLM's gpu_memory_utilization is a per-instance share of the whole GPU (vllm/v1/worker/gpu_worker.py
@35d5cda: it requests f x total memory and refuses to start if less is free), so memory another process
holds (a colocated trainer's resident states) shrinks the engine only past what the share leaves free."""

from __future__ import annotations

import pytest

from traces import CostModel, get_gpu, get_model

CM = CostModel.roofline_only()
H100, MODEL = get_gpu("H100"), get_model("qwen2.5-7b")


def _kv(resident: float) -> float:
    return float(CM.kv_capacity_tokens(H100, MODEL, 1, 1, resident))


def test_states_that_fit_beside_the_share_leave_the_kv_cache_as_it_is() -> None:
    outside = H100.hbm_bytes * (1 - CM.efficiency.engine_memory_fraction)  # 8 GB of 80 at the default 0.9
    assert _kv(0.5 * outside) == _kv(0.0)
    assert _kv(outside) == pytest.approx(_kv(0.0), rel=1e-12)


def test_states_past_the_free_memory_take_their_bytes_from_the_kv_cache() -> None:
    per_token = MODEL.kv_bytes_per_token  # TP1: each GPU holds a token's whole KV
    outside = H100.hbm_bytes * (1 - CM.efficiency.engine_memory_fraction)
    extra = 10e9
    assert _kv(outside + extra) == pytest.approx(_kv(0.0) - extra / per_token, rel=1e-9)
    assert _kv(H100.hbm_bytes) == 0.0  # nothing left: the simulator refuses such a plan (sim.simulate)
