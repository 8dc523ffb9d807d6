"""The analytic model of engines that are not interruptible (planner.tail_model): its limits, and
its agreement with the simulator on a non-interruptible asynchronous fleet."""

from __future__ import annotations

import math

import numpy as np
import pytest

from planner.candidates import candidates
from planner.milp import raced, solve
from planner.placement import reprice_sync, to_plan
from planner.tail_model import LENGTH_PROBS, DrainCurve, drain_loss_seconds, race, residual_lengths
from sim import simulate
from traces import Cluster, CostModel, Workload, get_model
from traces.lengths import LengthDist
from traces.records import recommended_steps, settle_cap

POINTS = np.array([1, 2, 4, 8, 16, 32])
STEP = 0.01  # seconds per decode iteration, whatever the batch (a memory-bound engine)


def _constant(running: np.ndarray, context: np.ndarray) -> np.ndarray:
    return np.full(np.broadcast(running, context).shape, STEP)


def test_fixed_lengths_drain_in_about_half_a_sample() -> None:
    """Fixed length L: held samples are uniformly part-way (R = U L, E[R] = L/2), so a drain of many
    samples takes about L iterations for L/2 iterations of work: the loss is about L/2 iterations."""
    residuals = residual_lengths(np.full(4096, 1000.0))
    assert residuals.mean() == pytest.approx(500.0, rel=0.02)
    loss = drain_loss_seconds(residuals, np.array([1000]), _constant, 300.0, sync_seconds=0.0)
    assert loss[0] == pytest.approx(500 * STEP, rel=0.02)


def test_a_long_tail_loses_more_than_fixed_lengths_and_the_weights_bound_the_wait() -> None:
    rng = np.random.default_rng(1)
    tail = np.sort(np.minimum(rng.lognormal(np.log(600) - 0.5, 1.0, 4096), 8192))
    fixed = np.full(4096, float(tail.mean()))
    long_loss = drain_loss_seconds(residual_lengths(tail), POINTS, _constant, 300.0, 0.0)
    short_loss = drain_loss_seconds(residual_lengths(fixed), POINTS, _constant, 300.0, 0.0)
    many = POINTS >= 4  # at 1-2 samples E[max] ~ the n/(n+1) quantile sits below a long tail's mean: no loss
    assert np.all(long_loss[many] > short_loss[many]) and np.all(long_loss >= 0)
    residuals = residual_lengths(fixed)
    waited = drain_loss_seconds(residuals, POINTS, _constant, 300.0, 1e4)
    # the weights take longer than any drain: the step loses their wait less the work it drained
    assert np.allclose(waited, 1e4 - residuals.mean() * STEP)


def test_a_thinning_batch_that_decodes_faster_loses_less() -> None:
    residuals = residual_lengths(np.full(4096, 1000.0))
    def faster(running: np.ndarray, context: np.ndarray) -> np.ndarray:  # a full batch costs STEP, one sample a tenth
        return STEP * (0.1 + 0.9 * np.minimum(1.0, running / 32)) + 0 * context
    slow = drain_loss_seconds(residuals, np.array([32]), _constant, 300.0, 0.0)
    fast = drain_loss_seconds(residuals, np.array([32]), faster, 300.0, 0.0)
    assert 0 <= fast[0] < slow[0]


def test_non_interruptible_engines_are_derated_by_their_drain() -> None:
    cluster = Cluster(name="h100", node_groups=({"gpu_type": "H100", "nodes": 2},))
    job = _longtail(interruptible=False)
    engine = next(o for o in candidates(CostModel(), cluster, job).engines if o.tp == 1)
    loss = engine.update_seconds
    assert loss and min(loss) >= 0 and loss[-1] > 0 and list(loss[2:]) == sorted(loss[2:])  # more held: longer drain
    slow = engine.derated(5.0)
    assert slow.samples_per_s < engine.samples_per_s
    assert engine.derated(1e9).samples_per_s == pytest.approx(engine.samples_per_s, rel=1e-6)


def _longtail(interruptible: bool) -> Workload:
    return Workload(name="longtail", model=get_model("qwen2.5-1.5b"), prompts_per_step=16, group_size=16,
                    prompt_len=LengthDist(kind="uniform", low=64, high=512),
                    response_len=LengthDist(kind="lognormal", mean=1500, sigma=1.0, cap=8192),
                    mode="async", staleness=1, interruptible=interruptible, ppo_minibatches=4)


def _ratio(cluster: Cluster, workload: Workload, settled: bool = False) -> float:
    """analytic / simulated samples/s of the MILP's best plan, placed and simulated as
    bench/analytic_vs_sim.py does (`settled`: as its --settled does, until the steady rate settles)."""
    cm = CostModel()
    cand = candidates(cm, cluster, workload)
    found = solve(cand, workload.mode, "throughput", None, None, 1, "auto")
    plan = to_plan(cluster, workload, cand, found[0])
    sol = raced(cand, reprice_sync(cm, cluster, workload, cand, found[0], plan))
    steps = settle_cap(workload.staleness) if settled else recommended_steps(workload.staleness)
    result = simulate(cluster, workload, plan, cm, steps=steps, seed=0, record_queue=False, until_settled=settled)
    return sol.samples_per_s / result.samples_per_s


ANALYTIC_BOUND = 0.15  # |analytic / simulated - 1| on the fleets below (the bench's goal is 0.20 at worst)
FLEETS = {  # fleets of bench/analytic_vs_sim.py (seed 0: #9, #44) where the old model was furthest off
    "l40s-a100-eta1": ((("L40S", 3, 12.5), ("A100-80G", 2, 12.5)), "qwen2.5-1.5b", 16, 16, 8192, 1),
    "a100-h100-h200-eta4": ((("A100-80G", 2, 12.5), ("H100", 3, 25.0), ("H200", 1, 50.0)), "llama-3.1-8b", 16, 8,
                            4096, 4),
}


@pytest.mark.parametrize("name", sorted(FLEETS))
def test_non_interruptible_async_analytic_agrees_with_the_simulator(name: str) -> None:
    """A long tail (lognormal mean 1,500, sigma 1) on engines that drain before each update: the old
    model (at most max(eta, 1) B E[o]/E[max o] in flight, no drain) was at 0.61 and 1.54 of the
    simulated rate (bench/analytic_vs_sim.py --compare). The race model (planner.tail_model.race)
    prices the steady state, so it is held to the settled simulation: the short recommended window
    of the eta-4 fleet under-states it (11.1 samples/s over 10 steps, 13.2 settled after 35)."""
    groups, model, prompts, group, cap, eta = FLEETS[name]
    cluster = Cluster(name=name, node_groups=tuple(
        {"gpu_type": t, "nodes": n, "gpus_per_node": 8, "inter_node_gb_per_s": bw} for t, n, bw in groups))
    workload = Workload(name="longtail", model=get_model(model), prompts_per_step=prompts, group_size=group,
                        prompt_len=LengthDist(kind="uniform", low=64, high=512),
                        response_len=LengthDist(kind="lognormal", mean=1500, sigma=1.0, cap=cap),
                        mode="async", staleness=eta, interruptible=False, ppo_minibatches=4)
    assert _ratio(cluster, workload, settled=True) == pytest.approx(1.0, abs=ANALYTIC_BOUND)


def _fixed_curve(points: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)) -> DrainCurve:
    """An engine whose batch of n fixed-length samples drains in D(n) = 1 + 0.01 n seconds."""
    return DrainCurve(points, tuple(1 + 0.01 * p for p in points), tuple(0.01 + 1e-4 * p for p in points),
                      tuple(np.full(len(LENGTH_PROBS), 512.0).tolist()), 0.01, tuple([512.0] * 14))


def test_race_is_training_bound_when_every_engine_drains_before_the_weights_come_in() -> None:
    """4 engines, B = 64, eta 1: a cohort spread 16 each drains in 1.16 s, before a 5 s step ends,
    so every version is water-filled over idle engines and the trainer sets the rate, B / step."""
    got = race(((_fixed_curve(), 64, 4),), 64, 1.0, 5.0, 0.3)
    assert got.samples_per_s == pytest.approx(64 / 5.0, rel=1e-9)
    assert not got.held_at_publish  # nothing to interrupt: interruptible engines would race alike


@pytest.mark.parametrize("engines", [2, 4, 8])
def test_race_the_first_to_drain_takes_the_next_cohort(engines: int) -> None:
    """A 1 s step, shorter than a spread cohort's drain D(B / E): the next weights come in while
    every engine drains, and the first to finish takes all B (up to its max batch) while the others
    idle. At eta 1 that repeats every 3 versions: a spread cohort, a whole one on one engine, then a
    step waiting for it, so 3 B per D(B / E) + D(B) + step, well below the training-bound 64/s."""
    got = race(((_fixed_curve(), 64, engines),), 64, 1.0, 1.0, 0.3)
    assert got.samples_per_s == pytest.approx(3 * 64 / ((1 + 0.01 * 64 / engines) + (1 + 0.01 * 64) + 1.0), rel=1e-6)
    assert got.held_at_publish  # still draining at a publish: an interruptible engine would be interrupted


def test_race_for_whether_an_engine_holds_samples_at_a_publish_stops_at_the_first_that_does() -> None:
    """held_only (an interruptible fleet's question): held, with no rate, where the full race finds an
    engine holding samples at a publish; the full race's answer where none does."""
    held = race(((_fixed_curve(), 64, 4),), 64, 1.0, 1.0, 0.3, held_only=True)
    assert held.held_at_publish and math.isnan(held.samples_per_s)
    assert race(((_fixed_curve(), 64, 4),), 64, 1.0, 5.0, 0.3, held_only=True) == \
        race(((_fixed_curve(), 64, 4),), 64, 1.0, 5.0, 0.3)


def test_fixed_length_non_interruptible_fleet_agrees_with_the_simulator() -> None:
    """bench/analytic_vs_sim.py seed 0 #18 (fixed 512 tokens, eta 1, not interruptible): the slope
    model, which spreads every version's samples over all engines, said 131 samples/s against 65
    simulated; the simulator hands each other version's cohort to the first engine to drain."""
    cluster = Cluster(name="fixed", node_groups=tuple(
        {"gpu_type": t, "nodes": n, "gpus_per_node": 8, "inter_node_gb_per_s": bw}
        for t, n, bw in (("H100", 2, 25.0), ("H800", 2, 25.0), ("L40S", 3, 12.5))))
    workload = Workload(name="fixed", model=get_model("qwen2.5-1.5b"), prompts_per_step=32, group_size=8,
                        prompt_len=LengthDist(kind="uniform", low=64, high=512),
                        response_len=LengthDist(kind="fixed", value=512), mode="async", staleness=1,
                        interruptible=False, ppo_minibatches=4)
    assert _ratio(cluster, workload) == pytest.approx(1.0, abs=0.05)
