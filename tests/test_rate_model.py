"""The answer's priced figure (planner.rate_model.raced): routed loads, the whole-engine update pause,
and on-policy plans raced as eta 0, each against the simulator on a fleet of bench/analytic_vs_sim.py."""

from __future__ import annotations

import numpy as np
import pytest

from planner.candidates import EngineOption, candidates
from planner.milp import raced, solve
from planner.placement import reprice_sync, to_plan
from planner.rate_model import routed_loads
from sim import simulate
from traces import Cluster, CostModel, Workload, get_model
from traces.lengths import LengthDist
from traces.records import settle_cap


def _option(pool: int, keys: tuple[float, ...], batch: int = 8) -> EngineOption:
    points = (1.0, 2.0, 4.0, 8.0)[: len(keys)]
    widths = np.diff(np.r_[0.0, points]).tolist()
    return EngineOption(pool, 1, 1.0, batch, 1.0, tuple((w, 0.1) for w in widths), 1.0, keys=keys)


def test_the_router_fills_engines_that_are_fast_per_iteration_first() -> None:
    """traces.routing: each sample to the least key with one more. An engine whose one-sample
    iteration (20 ms) is slower than the other's full batch (12 ms) holds nothing until those fill."""
    fast, slow = _option(0, (0.005, 0.006, 0.008, 0.012)), _option(1, (0.020, 0.021, 0.022, 0.024))
    points = [np.array([1.0, 2.0, 4.0, 8.0])] * 2
    assert routed_loads([(fast, 4), (slow, 4)], points, 20.0) == pytest.approx([5.0, 0.0], abs=1e-6)
    assert routed_loads([(fast, 4), (slow, 4)], points, 36.0) == pytest.approx([8.0, 1.0], abs=0.05)
    assert routed_loads([(fast, 4), (slow, 4)], points, 100.0) == [8.0, 8.0]  # all full


def _ratio(groups: tuple[tuple[str, int, float], ...], workload: Workload) -> tuple[float, float]:
    """(analytic by raced, analytic by the MILP's slopes) / simulated samples/s (settled) of the MILP's
    best plan, placed as bench/analytic_vs_sim.py --settled does."""
    cluster = Cluster(name="fleet", node_groups=tuple(
        {"gpu_type": t, "nodes": n, "gpus_per_node": 8, "inter_node_gb_per_s": bw} for t, n, bw in groups))
    cm = CostModel()
    cand = candidates(cm, cluster, workload)
    found = solve(cand, workload.mode, "throughput", None, None, 1, "auto")
    plan = to_plan(cluster, workload, cand, found[0])
    slopes = reprice_sync(cm, cluster, workload, cand, found[0], plan)
    result = simulate(cluster, workload, plan, cm, steps=settle_cap(workload.staleness), seed=0, record_queue=False,
                      until_settled=True)
    return raced(cand, slopes).samples_per_s / result.samples_per_s, slopes.samples_per_s / result.samples_per_s


def _workload(model: str, prompts: int, group: int, response: LengthDist, mode: str, eta: int, interruptible: bool,
              minibatches: int) -> Workload:
    return Workload(name="bench", model=get_model(model), prompts_per_step=prompts, group_size=group,
                    prompt_len=LengthDist(kind="uniform", low=64, high=512), response_len=response, mode=mode,
                    staleness=eta, interruptible=interruptible, ppo_minibatches=minibatches)


def test_interruptible_engines_are_priced_at_their_routed_loads_and_whole_update_pause() -> None:
    """bench seed 0 #17: 10 L40S TP2 engines next to H20 and H200 ones, fixed 1,024 tokens, eta 4.
    The slopes put 64 samples on each L40S TP2 engine; the router never reaches them (their one-sample
    iteration is slower than the others' at the loads the cap allows), and the H20s, loaded past the
    MILP's share, lose ~40% of their time re-prefilling after each update: 1.49x by the slopes."""
    w = _workload("llama-3.1-8b", 32, 16, LengthDist(kind="fixed", value=1024), "async", 4, True, 4)
    priced, slopes = _ratio((("L40S", 3, 12.5), ("H20", 3, 50.0), ("H200", 3, 50.0)), w)
    assert slopes > 1.4
    assert priced == pytest.approx(1.0, abs=0.1)


def test_on_policy_plans_are_raced_to_the_longest_sample_of_the_batch() -> None:
    """bench seed 0 #10 (sync, 6 H20 TP4 engines, B = 1,024, lognormal mean 600): each engine drains its
    171 samples in ~23 s, but the step waits for the longest of all 1,024 (~3,250 tokens against
    ~2,250 for the longest of 171), alone on its engine: 1.23x by the slopes."""
    w = _workload("qwen2.5-7b", 64, 16, LengthDist(kind="lognormal", mean=600, sigma=0.6, cap=4096), "sync", 0,
                  True, 4)
    priced, slopes = _ratio((("H20", 3, 25.0), ("H200", 3, 12.5)), w)
    assert slopes > 1.15
    assert priced == pytest.approx(1.0, abs=0.05)


def test_interruptible_engines_that_drain_before_each_publish_run_the_race() -> None:
    """bench seed 0 #27: 24 H20 TP1 engines, fixed 1,024 tokens, eta 1. Each takes its ~21 samples when
    the weights come in and finishes them ~0.5 s before the next publish, so no update interrupts
    anything: the whole-pause derating (5.5 s of weights and re-prefill at the routed load, every
    step) put it at 0.82 of the simulated rate; the race (planner.tail_model.race), which finds no
    engine holding samples at a publish, prices it as an engine that is not interruptible: 1.07
    (the settled run keeps one slow transient step; at steady state the trainer bounds both)."""
    w = _workload("qwen2.5-7b", 32, 16, LengthDist(kind="fixed", value=1024), "async", 1, True, 1)
    priced, _ = _ratio((("H20", 3, 25.0), ("L40S", 2, 12.5)), w)
    assert priced == pytest.approx(1.0, abs=0.1)


def test_the_race_routes_whole_samples() -> None:
    """bench seed 0 #47 (not interruptible, eta 1, lognormal mean 3,000 capped at 4,096; 2 A100 TP4, 8
    H200 and 16 H800 engines): the router gives each version's 128 samples to the A100s and H200s
    and none to the H800s, which are idle for the next version. Spread continuously, 14 samples made
    0.9 on each H800: all 16 kept draining, the next version went to one engine, and the race put
    the plan at 0.80 of the simulated rate."""
    w = _workload("qwen2.5-7b", 16, 8, LengthDist(kind="lognormal", mean=3000, sigma=0.6, cap=4096), "async", 1,
                  False, 1)
    priced, _ = _ratio((("A100-80G", 1, 25.0), ("H200", 1, 50.0), ("H800", 3, 12.5)), w)
    assert priced == pytest.approx(1.0, abs=0.1)
