"""Mechanisms of the cost model that decide an RL step, each with its effect in the direction and
size a cited public measurement shows: the decode overhead per running sequence, the prefill
overhead per pass, decoding without CUDA graphs, the running-sequence cap, small micro-batches."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sim import simulate
from traces import Cluster, CostModel, Plan, RolloutGroup, SpecError, TrainerGroup, Workload, get_gpu, get_model
from traces.io import validate
from traces.lengths import LengthDist

CM = CostModel.roofline_only()
A100, LLAMA2 = get_gpu("A100-80G"), get_model("llama-2-7b")
# LMDeploy v0.1.0a1 on A100 fp16 (docs/en/benchmark/a100_fp16.md, calibration rows C1, C3): llama-2-7b
# decodes 102.21 tok/s at batch 1 and 1504.72 tok/s at batch 16 (128 tokens out of a 1-token prompt)
LMDEPLOY_B1, LMDEPLOY_B16 = 102.21, 1504.72


def test_the_per_sequence_decode_overhead_sizes_small_batch_iterations() -> None:
    """An iteration of 16 sequences takes 16/1504.72 s against 1/102.21 s for one (C1, C3): 8.7%
    longer, though memory-bound decode reads the same weights. decode_overhead_per_seq_s carries
    that; without it the roofline grows only 2.9%."""
    measured = (16 / LMDEPLOY_B16) / (1 / LMDEPLOY_B1)
    ratio = float(CM.decode(A100, LLAMA2, 1, 16, 64).seconds / CM.decode(A100, LLAMA2, 1, 1, 64).seconds)
    assert ratio == pytest.approx(measured, rel=0.03)
    flat = CostModel.roofline_only(replace(CM.efficiency, decode_overhead_per_seq_s=0.0))
    without = float(flat.decode(A100, LLAMA2, 1, 16, 64).seconds / flat.decode(A100, LLAMA2, 1, 1, 64).seconds)
    assert without < measured - 0.04


def test_the_prefill_overhead_sizes_a_short_prompt() -> None:
    """TensorRT-LLM's A100 fp16 table (docs/source/performance.md, C15): a 128-token prompt of
    llama-2-7b reaches its first token in 16 ms, twice its compute; prefill_overhead_s carries the
    fixed part of a pass (no CUDA graph for prefill), without which the estimate is half of it."""
    assert float(CM.prefill(A100, LLAMA2, 1, 128).seconds) == pytest.approx(0.016, rel=0.1)
    bare = CostModel.roofline_only(replace(CM.efficiency, prefill_overhead_s=0.0))
    assert float(bare.prefill(A100, LLAMA2, 1, 128).seconds) < 0.7 * 0.016


def test_an_eager_engine_pays_its_launches_where_a_graph_would_not() -> None:
    """vLLM PR #1440 (CUDA graphs for Llama): llama-2-7b at batch 1, 100 tokens in 1.05 s with graphs,
    1.2 s without (14% slower), and no visible gain at bigger batches. The fitted constant is per layer
    (traces.costmodel.cuda_graphs); the graph-replayed iteration it adds to is the cost model's."""
    graph = float(CM.decode(A100, LLAMA2, 1, 1, 128).seconds)
    eager = float(CM.decode(A100, LLAMA2, 1, 1, 128, enforce_eager=True).seconds)
    assert eager / graph == pytest.approx(1.2 / 1.05, rel=0.03)
    big = float(CM.decode(A100, LLAMA2, 1, 256, 600, enforce_eager=True).seconds
                / CM.decode(A100, LLAMA2, 1, 256, 600).seconds)
    assert big < 1.03
    # above the largest captured graph a batch decodes eagerly; at or below it, as graphs do
    assert float(CM.decode(A100, LLAMA2, 1, 64, 600, graph_max_batch=64).seconds) == \
        float(CM.decode(A100, LLAMA2, 1, 64, 600).seconds)
    assert float(CM.decode(A100, LLAMA2, 1, 65, 600, graph_max_batch=64).seconds) > \
        float(CM.decode(A100, LLAMA2, 1, 65, 600).seconds)


CLUSTER = Cluster(name="a100", node_groups=({"gpu_type": "A100-80G", "nodes": 2},))


def _engine_rate(**group: object) -> float:
    """Samples/s of 8 llama-2-7b TP1 engines fed 1-token prompts, 128 tokens out (LMDeploy's setup)."""
    w = Workload(model=LLAMA2, prompts_per_step=64, group_size=4, prompt_len=LengthDist(kind="fixed", value=1),
                 response_len=LengthDist(kind="fixed", value=128), mode="async", staleness=2, interruptible=False)
    plan = Plan(mode="async", staleness=2, trainer=TrainerGroup(gpu_type="A100-80G", dp=8),
                rollout=(RolloutGroup(gpu_type="A100-80G", instances=8, **group),))  # type: ignore[arg-type]
    r = simulate(CLUSTER, w, plan, CM, steps=4, seed=0, record_queue=False)
    return r.samples_per_s


def test_the_running_sequence_cap_scales_a_decode_bound_engine_as_measured() -> None:
    """RolloutGroup.max_num_seqs (vLLM's): capped at 1 sequence an engine does what LMDeploy does at
    batch 1, at 16 what it does at 16: 14.7x the output, within 10%."""
    one, sixteen = _engine_rate(max_num_seqs=1), _engine_rate(max_num_seqs=16)
    assert sixteen / one == pytest.approx(LMDEPLOY_B16 / LMDEPLOY_B1, rel=0.1)


def test_eager_engines_generate_more_slowly_in_the_simulator() -> None:
    """The same engines without CUDA graphs, at 16 sequences each: slower by the launches per iteration."""
    graphs, eager = _engine_rate(max_num_seqs=16), _engine_rate(max_num_seqs=16, enforce_eager=True)
    per_iteration = float(CM.decode(A100, LLAMA2, 1, 16, 64).seconds)
    assert graphs / eager == pytest.approx(1 + 0.0015 / per_iteration, rel=0.05)  # 1.5 ms more an iteration
    assert _engine_rate(max_num_seqs=16, cuda_graph_max_batch=8) == pytest.approx(eager, rel=1e-9)


def test_small_micro_batches_train_more_slowly_once_fitted() -> None:
    """Efficiency.train_half_tokens (not fitted yet: 0, no effect) scales the training matmul rate by
    mb / (mb + half). With a half of 1024 tokens a 1024-token micro-batch trains at half the rate of
    a very large one. No cited measurement sizes it yet (see the report): this checks the mechanism."""
    gpu, model = get_gpu("H100"), get_model("llama-3.1-8b")
    half = CostModel.roofline_only(replace(CM.efficiency, train_half_tokens=1024.0))

    def compute(cm: CostModel, mb: int) -> float:
        return float(cm.train(gpu, model, 1, 1, 1, 65536, seq_len=mb, microbatch_tokens=mb).seconds)

    assert compute(half, 1024) / compute(CM, 1024) == pytest.approx(2.0, rel=1e-6)
    assert compute(half, 1024) / compute(CM, 1024) > compute(half, 8192) / compute(CM, 8192)


@pytest.mark.parametrize(("group", "field"), [
    ({"enforce_eager": "sometimes"}, "enforce_eager"),
    ({"cuda_graph_max_batch": 0}, "cuda_graph_max_batch"),
    ({"max_num_seqs": 0}, "max_num_seqs"),
])
def test_bad_engine_fields_are_one_line(group: dict[str, object], field: str) -> None:
    plan = {"rollout": [{"gpu_type": "A100-80G", "instances": 1, **group}], "trainer": {"gpu_type": "A100-80G"}}
    with pytest.raises(SpecError) as err:
        validate(Plan, plan, "p.json")
    assert field in str(err.value) and "\n" not in str(err.value)


def test_costs_decode_prices_an_eager_engine(cli) -> None:  # type: ignore[no-untyped-def]
    argv = ("costs", "decode", "--gpu", "A100-80G", "--model", "llama-2-7b", "--batch", "1", "--context", "128",
            "--json")
    graph, eager = cli(*argv).json()["seconds"], cli(*argv, "--enforce-eager").json()["seconds"]
    assert eager - graph == pytest.approx(1.5e-3, rel=1e-6)  # 32 layers' launches (vLLM PR #1440)
