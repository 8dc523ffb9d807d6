"""The cost model: memory feasibility, vectorisation, profiled tables and their sources."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from traces import SpecError, get_gpu, get_model
from traces.costmodel import PROFILE, ROOFLINE, SCALED, CostModel, ProfileTable


@pytest.fixture(scope="module")
def cm() -> CostModel:
    return CostModel.roofline_only()


def test_70b_does_not_fit_one_80gb_gpu_for_decode(cm: CostModel) -> None:
    h100, m = get_gpu("H100"), get_model("llama-3.1-70b")
    assert cm.max_batch(h100, m, 1, 1024) == 0
    assert cm.max_batch(h100, m, 4, 1024) > 0  # TP4 fits with room for a KV cache


def test_7b_full_finetune_needs_sharding_on_24gb(cm: CostModel) -> None:
    l4, m = get_gpu("L4"), get_model("qwen2.5-7b")
    assert not cm.train_fits(l4, m, 1, 1, 1, microbatch_tokens=1024, seq_len=1024, zero_stage=0)
    # ZeRO-3 over 16 GPUs brings the 16 bytes/param of states to ~7.6 GB per GPU.
    assert cm.train_fits(l4, m, 16, 1, 1, microbatch_tokens=1024, seq_len=1024, zero_stage=3)
    assert cm.train_fits(get_gpu("H100"), m, 8, 1, 1, microbatch_tokens=8192, seq_len=8192)


def test_training_memory_shrinks_with_sharding_and_recompute(cm: CostModel) -> None:
    g, m = get_gpu("H100"), get_model("qwen2.5-7b")
    mem = cm.train_memory_bytes(g, m, np.array([1, 8, 8]), 1, 1, microbatch_tokens=8192, seq_len=8192)
    assert mem[0] > mem[1]
    full = cm.train_memory_bytes(g, m, 8, 1, 1, microbatch_tokens=8192, seq_len=8192, recompute="full")
    none = cm.train_memory_bytes(g, m, 8, 1, 1, microbatch_tokens=8192, seq_len=8192, recompute="none")
    assert full < mem[1] < none


def test_decode_grows_with_batch_and_context(cm: CostModel) -> None:
    g, m = get_gpu("H20"), get_model("qwen2.5-7b")
    t = cm.decode(g, m, 1, np.array([1, 64, 256]), 2048).seconds
    assert np.all(np.diff(t) > 0)
    assert cm.decode(g, m, 1, 64, 8192).seconds > cm.decode(g, m, 1, 64, 1024).seconds


def test_bandwidth_rich_gpu_decodes_cheaper_when_memory_bound(cm: CostModel) -> None:
    """H20 has 4.0 TB/s but 148 TFLOP/s: memory-bound decode (small batch, long context) costs less per
    token than on H800; compute-bound training does not."""
    m = get_model("qwen2.5-7b")
    h20, h800 = get_gpu("H20"), get_gpu("H800")
    gen = {g.name: 32 / float(cm.decode(g, m, 1, 32, 8192).seconds) / g.price_per_gpu_hour for g in (h20, h800)}
    train = {g.name: 1e6 / float(cm.train(g, m, 8, 1, 1, 1e6).seconds) / g.price_per_gpu_hour for g in (h20, h800)}
    assert gen["H20"] > gen["H800"]
    assert train["H800"] > train["H20"]


def test_vectorised_equals_scalar(cm: CostModel) -> None:
    g, m = get_gpu("A100-80G"), get_model("llama-3.1-8b")
    tp, b, ctx = np.array([1, 2, 4]), np.array([8, 64, 200]), np.array([512, 1024, 4096])
    vec = cm.decode(g, m, tp, b, ctx).seconds
    one = [float(cm.decode(g, m, int(t), int(x), int(c)).seconds) for t, x, c in zip(tp, b, ctx, strict=True)]
    np.testing.assert_allclose(vec, one)


def test_every_estimate_names_its_source(cm: CostModel) -> None:
    g, m = get_gpu("H100"), get_model("qwen3-8b")
    for est in (cm.decode(g, m, 1, 8, 100), cm.prefill(g, m, 1, 1000), cm.train(g, m, 8, 1, 1, 1e5),
                cm.logprob(g, m, 8, 1, 1, 1e5), cm.sync(g, m, 4, 50e9)):
        assert est.sources == {ROOFLINE}


def _table(rows: list[dict]) -> ProfileTable:  # type: ignore[type-arg]
    base = {"tp": 1, "pp": 1, "dp": 1, "batch": 0, "context": 0, "tokens": 0, "source": "test"}
    return ProfileTable.from_frame(pd.DataFrame([{**base, **r} for r in rows]))


def _decode_grid(scale: float) -> ProfileTable:
    cmr = CostModel.roofline_only()
    g, m = get_gpu("H200"), get_model("qwen2.5-1.5b")
    rows = []
    for b in (1, 16, 64):
        for c in (256, 1024, 4096):
            sec = float(cmr.decode(g, m, 1, b, c).seconds) * scale
            rows.append({"gpu_type": "H200", "model": "qwen2.5-1.5b", "stage": "decode", "tp": 1,
                         "batch": b, "context": c, "seconds": sec})
    return _table(rows)


def test_profile_table_wins_inside_its_range() -> None:
    cm = CostModel(_decode_grid(scale=2.0))
    g, m = get_gpu("H200"), get_model("qwen2.5-1.5b")
    roof = float(CostModel.roofline_only().decode(g, m, 1, 16, 1024).seconds)
    est = cm.decode(g, m, 1, 16, 1024)
    assert est.sources == {PROFILE}
    assert float(est.seconds) == pytest.approx(2 * roof, rel=1e-6)
    between = cm.decode(g, m, 1, 32, 2000)  # interpolated in log space
    assert between.sources == {PROFILE}


def test_profile_table_never_extrapolates_silently() -> None:
    cm = CostModel(_decode_grid(scale=2.0))
    g, m = get_gpu("H200"), get_model("qwen2.5-1.5b")
    est = cm.decode(g, m, 1, 256, 1024)  # batch beyond the table
    assert est.sources == {SCALED}
    roof = float(CostModel.roofline_only().decode(g, m, 1, 256, 1024).seconds)
    assert float(est.seconds) == pytest.approx(2 * roof, rel=0.05)  # roofline scaled to the nearest row
    other_tp = cm.decode(g, m, 2, 16, 1024)  # no rows at TP2: roofline
    assert other_tp.sources == {ROOFLINE}


def test_profile_table_1d_train_rows() -> None:
    g, m = get_gpu("H100"), get_model("qwen2.5-7b")
    table = _table([{"gpu_type": "H100", "model": "qwen2.5-7b", "stage": "train", "dp": 8, "tokens": t, "seconds": s}
                    for t, s in ((1e4, 1.0), (1e5, 8.0))])
    cm = CostModel(table)
    mid = cm.train(g, m, 8, 1, 1, np.array([1e4, 3.16e4, 1e6]))
    assert list(mid.source) == [PROFILE, PROFILE, SCALED]
    assert mid.seconds[1] == pytest.approx(np.exp((np.log(1.0) + np.log(8.0)) / 2), rel=0.01)


def test_bad_profile_table_is_named() -> None:
    with pytest.raises(SpecError, match="missing columns"):
        ProfileTable.from_frame(pd.DataFrame({"gpu_type": ["H100"]}))
    with pytest.raises(SpecError, match="unknown stage"):
        _table([{"gpu_type": "H100", "model": "x", "stage": "decoder", "tp": 1, "seconds": 1.0}])


def test_roofline_p_blends_compute_and_memory_most_at_the_ridge() -> None:
    """Efficiency.roofline_p: 0 is the plain roofline (the larger time), 1 the sum, between them the
    p-norm; a pass far from the ridge (a long prompt: compute-bound) barely moves, one on it does."""
    from dataclasses import replace

    from traces.costmodel import DEFAULT_EFFICIENCY
    from traces.costmodel.roofline import prefill_seconds, roof_seconds

    eff = DEFAULT_EFFICIENCY
    assert float(roof_seconds(3.0, 4.0, eff)) == 4.0
    assert float(roof_seconds(3.0, 4.0, replace(eff, roofline_p=1.0))) == pytest.approx(7.0)
    assert float(roof_seconds(3.0, 4.0, replace(eff, roofline_p=2.0))) == pytest.approx(5.0)
    gpu, model, blended = get_gpu("A100-80G"), get_model("llama-2-7b"), replace(eff, roofline_p=4.0)

    def gain(tokens: int) -> float:
        return float(prefill_seconds(gpu, model, 1, tokens, tokens, blended)
                     / prefill_seconds(gpu, model, 1, tokens, tokens, eff)) - 1

    assert gain(8 * 2048) < 0.01 < 0.05 < gain(128)


def test_link_bandwidth_is_halved_once_to_the_one_way_rate_collectives_use() -> None:
    """Catalog links are both directions summed (H100 NVLink: 900 GB/s); GpuType.link_bytes_per_s is
    one direction, and a ring all-reduce moves 2(n-1)/n of the message over it (nccl-tests' bus
    bandwidth, doc/PERFORMANCE.md): 1 GB over 8 H100s takes 2 x 7/8 x 1 GB / 450 GB/s."""
    from dataclasses import replace

    from traces.costmodel import DEFAULT_EFFICIENCY
    from traces.costmodel.roofline import allreduce_seconds
    from traces.hardware import gpu_catalog

    for gpu in gpu_catalog().values():
        assert gpu.link_bytes_per_s == pytest.approx(gpu.link_gb_per_s * 1e9 / 2), gpu.name
    h100 = get_gpu("H100")
    no_latency = replace(DEFAULT_EFFICIENCY, collective_latency_s=0.0)
    assert float(allreduce_seconds(1e9, 8, h100.link_bytes_per_s, no_latency)) == pytest.approx(2 * 7 / 8 / 450)


def test_a_cached_prefix_adds_its_attention_to_a_prefill(cm: CostModel) -> None:
    """A tool result prefilled after K cached tokens: every new token attends to them too, 4 layers T K
    attn_dim more FLOPs (compute-bound here, max roofline: exactly that over the matmul rate)."""
    import dataclasses

    from traces.costmodel import roofline as rf

    gpu, m = get_gpu("H800"), get_model("qwen2.5-1.5b")
    eff = dataclasses.replace(cm.efficiency, roofline_p=0.0)
    tokens, cached = 4096.0, 16384.0
    bare = float(rf.prefill_seconds(gpu, m, 1, tokens, tokens, eff))
    assert float(rf.prefill_seconds(gpu, m, 1, tokens, tokens, eff, 1, 0.0)) == bare
    extra = 4 * m.layers * tokens * cached * m.attn_dim / (gpu.bf16_flops * gpu.matmul_ceiling * eff.matmul)
    assert float(rf.prefill_seconds(gpu, m, 1, tokens, tokens, eff, 1, cached)) - bare == pytest.approx(extra)
    # the cost model's prefill takes it too, and nothing changes without a prefix
    assert float(cm.prefill(gpu, m, 1, 200, 200, 1, 8000).seconds) > float(cm.prefill(gpu, m, 1, 200, 200).seconds)
    assert float(cm.prefill(gpu, m, 1, 200, 200, 1, 0).seconds) == float(cm.prefill(gpu, m, 1, 200, 200).seconds)
