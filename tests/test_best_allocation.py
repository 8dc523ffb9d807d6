"""Brute force, judged by the simulator: on small fleets the plan `plan` returns is within 2% of the
best of every allocation (tests/allocations.py), each simulated as the planner simulates its own.

Both sides are judged by settling runs (planner.confirm; every allocation is settled). Three fleets
run in the fast suite, one of them (H800 + L40S) where the MILP's own answer is 4% short in my run
and only the engine-mix search (planner.rerank.explore_engines) finds the best; the issue's three
fleets with the long-tailed 7B job are slow-marked (their 7B simulations take a few seconds each).
"""

from __future__ import annotations

import pytest
from allocations import simulated_best

from planner.api import plan_report
from traces import Cluster, CostModel, Workload, example_workload, get_model
from traces.lengths import LengthDist

CM = CostModel()


def _fleet(*groups: tuple[str, int, int]) -> Cluster:
    return Cluster(name="+".join(f"{n * per}{t}" for t, n, per in groups),
                   node_groups=tuple({"gpu_type": t, "nodes": n, "gpus_per_node": per} for t, n, per in groups))


def _job(name: str) -> Workload:
    if name in ("qwen2.5-7b-grpo-longtail", "llama-3.1-8b-grpo-4k", "qwen2.5-1.5b-math-short"):
        return example_workload(name)
    prompt = LengthDist(kind="uniform", low=64, high=512)
    if name == "1.5b-tail":  # a short mean, a long capped tail, staleness 2
        return Workload(name=name, model=get_model("qwen2.5-1.5b"), prompts_per_step=16, group_size=8,
                        prompt_len=prompt, response_len=LengthDist(kind="lognormal", mean=800, sigma=1.0, cap=8192),
                        mode="async", staleness=2)
    assert name == "7b-sync"  # on-policy: each step waits for its longest sample
    return Workload(name=name, model=get_model("qwen2.5-7b"), prompts_per_step=16, group_size=8, prompt_len=prompt,
                    response_len=LengthDist(kind="lognormal", mean=1500, sigma=1.0, cap=8192), mode="sync",
                    staleness=0)


def _within_two_percent(cluster: Cluster, workload: Workload) -> None:
    best = simulated_best(CM, cluster, workload)
    got = plan_report(cluster, workload, cost_model=CM, baselines=False, marginal=False).chosen
    assert best.count >= 18
    assert got.samples_per_s >= 0.98 * best.best.samples_per_s, (
        got.samples_per_s, best.best.samples_per_s, best.best.plan.rollout, got.plan.rollout)


def test_the_engine_mix_search_finds_the_best_where_the_milp_falls_short() -> None:
    cluster, workload = _fleet(("H800", 1, 8), ("L40S", 1, 8)), _job("1.5b-tail")
    _within_two_percent(cluster, workload)
    # the subject matters: without the engine-mix search the plan is more than 2% short here
    best = simulated_best(CM, cluster, workload).best.samples_per_s
    plain = plan_report(cluster, workload, cost_model=CM, baselines=False, marginal=False, explore=0).chosen
    assert plain.samples_per_s < 0.98 * best


@pytest.mark.parametrize(("groups", "job"), [
    ((("H800", 1, 8), ("H20", 1, 8)), "1.5b-tail"),
    ((("H800", 1, 4), ("H20", 1, 4), ("L40S", 1, 4)), "7b-sync"),  # 72 allocations, on-policy
])
def test_the_plan_is_within_two_percent_of_the_simulated_best(groups: tuple[tuple[str, int, int], ...],
                                                             job: str) -> None:
    _within_two_percent(_fleet(*groups), _job(job))


@pytest.mark.slow
@pytest.mark.parametrize("groups", [  # the three fleets: 18, 133 and 72 allocations, 40-160 s each
    (("H800", 1, 8), ("H20", 1, 8)),
    (("H800", 1, 8), ("H20", 2, 8)),
    (("H800", 1, 4), ("H20", 1, 4), ("L40S", 1, 4)),
])
def test_the_plan_is_within_two_percent_on_the_reported_fleets(groups: tuple[tuple[str, int, int], ...]) -> None:
    _within_two_percent(_fleet(*groups), _job("qwen2.5-7b-grpo-longtail"))
