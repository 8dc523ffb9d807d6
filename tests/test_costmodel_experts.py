"""Cross-node expert-parallel dispatch (traces.costmodel.experts): node-deduplicated, as DeepEP sends it."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np

from traces import get_model
from traces.costmodel import DEFAULT_EFFICIENCY
from traces.costmodel.experts import remote_nodes_hit, train_alltoall_seconds

EFF = replace(DEFAULT_EFFICIENCY, collective_latency_s=0.0)


def _enumerated_remote_nodes(experts: int, k: int, nodes: int) -> float:
    """Mean over every k-subset of experts of the other nodes it touches (node 0 is the sender's)."""
    per_node = experts // nodes
    hits = [len({e // per_node for e in pick} - {0}) for pick in itertools.combinations(range(experts), k)]
    return sum(hits) / len(hits)


def test_remote_nodes_hit_matches_enumeration() -> None:
    for experts, k, nodes in ((8, 2, 2), (12, 3, 3), (16, 4, 4), (16, 1, 4)):
        assert math.isclose(float(remote_nodes_hit(experts, k, nodes)), _enumerated_remote_nodes(experts, k, nodes),
                            rel_tol=1e-12)
    assert float(remote_nodes_hit(128, 8, 1)) == 0.0  # one node: nothing crosses the network


def test_cross_node_dispatch_sends_a_token_once_per_remote_node() -> None:
    """Qwen3-235B-A22B (top-8 of 128) over EP32 on 4 nodes of 8: the network carries each token to the
    ~2.7 remote nodes its experts are on, not 8 x 31/32 copies, so the step's all-to-all is that much
    shorter than the naive one when the network leg dominates."""
    model = get_model("qwen3-235b-a22b")
    assert model.moe is not None
    kw = {"passes": 2.0, "link_bytes_per_s": 450e9, "gpus_per_node": 8, "inter_node_bytes_per_s": 50e9}
    dp, tp, pp, ep, tokens = 16, 2, 8, 32, 2048 * 4096
    got = float(train_alltoall_seconds(model, dp, tp, pp, ep, tokens, EFF, **kw))
    token_bytes = tokens / (dp * tp) * model.hidden * model.bytes_per_param
    remote = float(remote_nodes_hit(model.moe.experts, model.moe.experts_per_token, 4))
    assert 2.5 < remote < 3.0
    per_a2a = token_bytes * remote / 50e9
    assert math.isclose(got, 2.0 * 2 * (model.moe_layers / pp) * per_a2a, rel_tol=1e-9)
    naive = 2.0 * 2 * (model.moe_layers / pp) * (ep - 1) / ep * token_bytes * model.moe.experts_per_token / 50e9
    assert got < naive / 2.5
    # within one node nothing changes: top-k copies over NVLink
    inside = float(train_alltoall_seconds(model, dp, tp, pp, 8, tokens, EFF, **kw))
    assert math.isclose(inside, 2.0 * 2 * (model.moe_layers / pp) * 7 / 8 * token_bytes * 8 / 450e9, rel_tol=1e-9)
    assert np.isfinite(got)


def test_moe_layer_overhead_adds_a_fixed_cost_per_layer_pass_and_micro_batch() -> None:
    """Efficiency.moe_layer_overhead_s: per MoE layer of the stage, per pass (forward + 2 backward) and per
    micro-batch; a dense model pays nothing."""
    from traces import CostModel, get_gpu

    gpu, moe, dense = get_gpu("H100"), get_model("qwen3-235b-a22b"), get_model("llama-3.1-8b")
    kw = {"seq_len": 4096, "microbatch_tokens": 4096, "zero_stage": 1, "recompute": "selective", "ep": 8}
    tokens, dp, tp, pp = 64 * 4096, 16, 1, 1  # 4 micro-batches per rank, no pipeline bubble

    def step(model: object, overhead: float) -> float:
        cm = CostModel.roofline_only(replace(DEFAULT_EFFICIENCY, moe_layer_overhead_s=overhead))
        return float(cm.train(gpu, model, dp, tp, pp, tokens, **kw).seconds)  # type: ignore[arg-type]

    assert moe.moe is not None
    extra = step(moe, 1e-3) - step(moe, 0.0)
    assert math.isclose(extra, 4 * 3 * moe.moe_layers * 1e-3, rel_tol=1e-9)
    kw["ep"] = 1
    assert step(dense, 1e-3) == step(dense, 0.0)


def test_cuda_graph_rows_pay_no_moe_layer_overhead() -> None:
    """C67 (Megatron-Core with HybridEP and CUDA graphs) replays its launches: its prediction does not move
    with moe_layer_overhead_s, while C61 (no graphs) does."""
    from sim.calibration_set import case
    from traces import CostModel
    from traces.calibration import load_calibration
    from traces.costmodel.fit import Case

    rows = {r.id: r for r in load_calibration()}
    lo = CostModel.roofline_only(replace(DEFAULT_EFFICIENCY, moe_layer_overhead_s=0.0))
    hi = CostModel.roofline_only(replace(DEFAULT_EFFICIENCY, moe_layer_overhead_s=2e-3))
    c67, c61 = case(rows["C67"]), case(rows["C61"])
    assert isinstance(c67, Case) and isinstance(c61, Case)
    assert c67.predict(lo) == c67.predict(hi)
    assert c61.predict(hi) < 0.9 * c61.predict(lo)
