"""Mechanisms that decide an RL step, each a field a user sets, each moving the prediction the way it should."""

from __future__ import annotations

import pytest

from sim import simulate
from traces import Cluster, CostModel, Plan, RolloutGroup, TrainerGroup, Workload, get_model
from traces.lengths import LengthDist

CM = CostModel.roofline_only()
CLUSTER = Cluster(name="c", node_groups=({"gpu_type": "H800", "nodes": 1}, {"gpu_type": "H20", "nodes": 1}))


def _rate(max_num_seqs: int | None) -> float:
    w = Workload(model=get_model("qwen2.5-1.5b"), prompts_per_step=128, group_size=8,
                 prompt_len=LengthDist(kind="fixed", value=128), response_len=LengthDist(kind="fixed", value=512),
                 staleness=2, interruptible=False)
    plan = Plan(mode="async", staleness=2, trainer=TrainerGroup(gpu_type="H800", dp=8),
                rollout=(RolloutGroup(gpu_type="H20", instances=2, tp=4, max_num_seqs=max_num_seqs),))
    return simulate(CLUSTER, w, plan, CM, steps=6, seed=0).samples_per_s


def test_running_sequence_cap_is_a_plan_field() -> None:
    """vLLM's max_num_seqs: a decode-bound engine does more with more sequences running, up to its KV
    cache (here 2 engines and 3,072 samples in flight, so a cap of 1,024 still binds, 256 more so)."""
    low, default, high = _rate(64), _rate(None), _rate(1024)
    assert low < default < high
    assert _rate(256) == default  # None is vLLM's default of 256


def test_a_capped_lognormal_may_have_its_uncapped_mean_above_the_cap() -> None:
    """Runs whose answers mostly hit the length limit (a long-CoT model at a 4k cap) are describable."""
    import numpy as np

    d = LengthDist(kind="lognormal", mean=6000, sigma=0.5, cap=4096)
    draws = d.sample(np.random.default_rng(0), 10_000)
    assert draws.max() == 4096 and (draws == 4096).mean() > 0.65  # P(L > 4096) = 0.70 for this lognormal
    assert 3500 < d.expected() < 4096


def test_step_phases_add_up_to_the_step_and_name_verls_metrics() -> None:
    """`simulate --breakdown`: wait (verl's timing_s/gen in sync modes) + hand-overs + logprob + train +
    sync is the step, and the steady-state mean step is the result's."""
    from sim.breakdown import mean_phases, step_phases
    from traces.phases import PHASES

    w = Workload(model=get_model("qwen2.5-1.5b"), prompts_per_step=32, group_size=8, mode="colocated",
                 prompt_len=LengthDist(kind="fixed", value=128),
                 response_len=LengthDist(kind="lognormal", mean=400, sigma=0.8, cap=2048))
    plan = Plan(mode="colocated", rollout=(RolloutGroup(gpu_type="H800", instances=8),),
                trainer=TrainerGroup(gpu_type="H800", dp=8))
    r = simulate(CLUSTER, w, plan, CM, steps=4, seed=0)
    steps = step_phases(r.timeline)
    assert len(steps) == 4 and (steps.switch > 0).all() and (steps.wait > steps.train).all()
    parts = steps[[p for p in PHASES if p != "step"]].sum(axis=1)
    assert (abs(parts - steps.step) < 1e-9).all()
    assert mean_phases(r.timeline, 0)["step"] == pytest.approx(r.mean_step_s)
