"""Specs, shipped data and the plan format."""

from __future__ import annotations

import numpy as np
import pytest

from traces import (
    Cluster,
    Plan,
    RolloutGroup,
    SpecError,
    TrainerGroup,
    example_cluster,
    example_clusters,
    example_workload,
    example_workloads,
    get_gpu,
    get_model,
    load_cluster,
    load_plan,
    load_workload,
)
from traces.lengths import LengthDist

REQUIRED_GPUS = [
    "H100", "H800", "H200", "H20", "A100-80G", "A100-40G", "L40S", "L4", "A10G", "RTX4090", "MI300X", "B200",
]
# Published parameter counts (billions) from the model cards.
PUBLISHED_PARAMS = {
    "llama-2-7b": 6.74, "llama-3.1-8b": 8.03, "llama-3.1-70b": 70.6, "qwen2.5-1.5b": 1.54,
    "qwen2.5-7b": 7.62, "qwen2.5-14b": 14.7, "qwen2.5-32b": 32.8, "qwen3-8b": 8.2, "qwen3-14b": 14.8,
    "qwen3-32b": 32.8,
}


@pytest.mark.parametrize("name", REQUIRED_GPUS)
def test_catalog_has_gpu_case_insensitively(name: str) -> None:
    gpu = get_gpu(name.lower())
    assert gpu.name == name
    assert gpu.source and gpu.date and gpu.price_per_gpu_hour > 0


def test_catalog_figures_match_design_table() -> None:
    h20 = get_gpu("H20")
    assert (h20.bf16_tflops, h20.hbm_gb, h20.hbm_tb_per_s, h20.link_gb_per_s) == (148, 96, 4.0, 900)
    assert get_gpu("L40S").link_kind == "pcie4"


@pytest.mark.parametrize(("name", "billions"), PUBLISHED_PARAMS.items())
def test_model_parameter_counts(name: str, billions: float) -> None:
    assert get_model(name).params / 1e9 == pytest.approx(billions, rel=0.01)


def test_kv_bytes_per_token() -> None:
    # llama-3.1-8b: 2 (K,V) x 32 layers x 8 kv heads x 128 dims x 2 bytes.
    assert get_model("llama-3.1-8b").kv_bytes_per_token == 2 * 32 * 8 * 128 * 2


def test_unknown_names_list_the_known_ones() -> None:
    with pytest.raises(SpecError, match=r"unknown GPU type 'H1000'.*known: .*H100"):
        get_gpu("H1000")
    with pytest.raises(SpecError, match=r"unknown model 'llama-9'.*known: .*llama-3\.1-8b"):
        get_model("llama-9")


@pytest.mark.parametrize("name", ["mixed-h800-h20-l40s", "h100-64", "a100-l4"])
def test_example_clusters_load(name: str) -> None:
    assert name in example_clusters()
    assert example_cluster(name).total_gpus > 0


def test_mixed_cluster_counts() -> None:
    assert example_cluster("mixed-h800-h20-l40s").gpu_counts == {"H800": 64, "H20": 128, "L40S": 32}


@pytest.mark.parametrize("name", ["qwen2.5-7b-grpo-longtail", "llama-3.1-8b-grpo-4k", "qwen2.5-1.5b-math-short"])
def test_example_workloads_load(name: str) -> None:
    assert name in example_workloads()
    w = example_workload(name)
    assert w.samples_per_step == w.prompts_per_step * w.group_size


def test_longtail_workload_reaches_8k() -> None:
    w = example_workload("qwen2.5-7b-grpo-longtail")
    assert w.response_len.max == 8192
    lengths = w.response_len.sample(np.random.default_rng(0), 50_000)
    assert lengths.max() == 8192  # the cap is reached: the tail is there
    assert np.median(lengths) < 0.6 * lengths.mean() * 1.5


@pytest.mark.parametrize(
    "dist",
    [
        LengthDist(kind="fixed", value=100),
        LengthDist(kind="uniform", low=10, high=30),
        LengthDist(kind="lognormal", mean=500, sigma=1.0, cap=4000),
        LengthDist(kind="empirical", lengths=(10, 100, 1000), counts=(5, 3, 2)),
    ],
)
def test_length_mean_matches_samples(dist: LengthDist) -> None:
    samples = dist.sample(np.random.default_rng(1), 200_000)
    assert samples.mean() == pytest.approx(dist.expected(), rel=0.02)
    assert samples.max() <= dist.max and samples.min() >= 1


def test_empirical_histogram_file(write) -> None:  # type: ignore[no-untyped-def]
    write("hist.csv", "length,count\n100,3\n1000,1\n")
    path = write(
        "w.yaml",
        "model: qwen2.5-1.5b\nprompts_per_step: 4\nprompt_len: {kind: fixed, value: 10}\n"
        "response_len: {kind: empirical, file: hist.csv}\n",
    )
    w = load_workload(path)
    assert w.response_len.expected() == pytest.approx((300 + 1000) / 4)


def test_sync_mode_with_staleness_is_contradictory(write) -> None:  # type: ignore[no-untyped-def]
    path = write(
        "w.yaml",
        "model: qwen2.5-1.5b\nprompts_per_step: 4\nprompt_len: {kind: fixed, value: 10}\n"
        "response_len: {kind: fixed, value: 10}\nmode: sync\nstaleness: 2\n",
    )
    with pytest.raises(SpecError, match="staleness 2 contradicts mode 'sync'"):
        load_workload(path)


def test_cluster_needs_links_between_labels() -> None:
    with pytest.raises(Exception, match="no bandwidth between labels"):
        Cluster.model_validate({"node_groups": [
            {"gpu_type": "H100", "nodes": 1, "label": "a"}, {"gpu_type": "L4", "nodes": 1, "label": "b"}]})


def test_cluster_label_bandwidth() -> None:
    c = example_cluster("a100-l4")
    assert c.label_bandwidth("dc-a", "dc-b") == 12.5e9
    assert c.label_bandwidth("dc-a", "dc-a") is None


def _plan() -> Plan:
    return Plan(
        cluster="mixed", workload="w", model="qwen2.5-7b", mode="async", staleness=4,
        rollout=(RolloutGroup(gpu_type="h20", tp=2, instances=16, nodes=(0, 1, 2, 3)),
                 RolloutGroup(gpu_type="L40S", tp=2, instances=8)),
        trainer=TrainerGroup(gpu_type="H800", dp=8, tp=2, pp=2), max_concurrent_rollouts=512,
        predicted={"samples_per_s": 12.5, "cost_per_hour": 300.0},
    )


def test_plan_round_trip_is_lossless(tmp_path) -> None:  # type: ignore[no-untyped-def]
    plan = _plan()
    assert Plan.from_json(plan.to_json()) == plan
    plan.save(tmp_path / "p.json")
    assert load_plan(tmp_path / "p.json") == plan
    assert '"schema_version": 1' in plan.to_json()


def test_plan_counts_gpus() -> None:
    plan = _plan()
    assert plan.gpus_by_type == {"H20": {"rollout": 32, "train": 0}, "L40S": {"rollout": 16, "train": 0},
                                 "H800": {"rollout": 0, "train": 32}}
    assert plan.total_gpus == 80


def test_plan_schema_version_checked() -> None:
    text = _plan().to_json().replace('"schema_version": 1', '"schema_version": 99')
    with pytest.raises(SpecError, match="schema_version 99 is not supported"):
        Plan.from_json(text)


def test_load_cluster_missing_file() -> None:
    with pytest.raises(SpecError, match="no such file"):
        load_cluster("/nonexistent/cluster.yaml")
