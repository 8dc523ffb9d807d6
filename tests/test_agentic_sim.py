"""Agentic episodes in the simulator (sim.tool_calls, sim.reference.tool_calls): a turn that ends in a
tool call leaves its engine and comes back with its grown context."""

from __future__ import annotations

import numpy as np
import pytest

from sim import simulate
from traces import CostModel, Plan, RolloutGroup, TrainerGroup, example_cluster, get_model
from traces.agentic import Agentic, SecondsDist
from traces.episodes import Episodes
from traces.lengths import LengthDist
from traces.staleness import lag_bound
from traces.workload import Workload

CM = CostModel.roofline_only()
CLUSTER = example_cluster("mixed-h800-h20-l40s")
ANSWER = LengthDist(kind="lognormal", mean=400, sigma=1.0, cap=2048)
TOOLS = Agentic(turns=LengthDist(kind="uniform", low=1, high=4),
                tool_latency=SecondsDist(kind="lognormal", mean=2.0, sigma=1.0, cap=30.0),
                tool_tokens=LengthDist(kind="lognormal", mean=200, sigma=1.0, cap=1024))


def _workload(agentic: Agentic | None, eta: float = 2, prompts: int = 16, interruptible: bool = True) -> Workload:
    return Workload(model=get_model("qwen2.5-1.5b"), prompts_per_step=prompts, group_size=8,
                    prompt_len=LengthDist(kind="uniform", low=64, high=256), response_len=ANSWER, mode="async",
                    staleness=eta, interruptible=interruptible, reward_seconds=0.01, agentic=agentic)


def _plan(eta: float = 2, engines: int = 4, max_num_seqs: int | None = None) -> Plan:
    return Plan(mode="async", staleness=eta, trainer=TrainerGroup(gpu_type="H800", dp=8),
                rollout=(RolloutGroup(gpu_type="H20", tp=1, instances=engines, max_num_seqs=max_num_seqs),))


@pytest.mark.parametrize("token_level", [False, True])
def test_one_turn_without_latency_simulates_exactly_like_the_single_turn_workload(token_level: bool) -> None:
    one = Agentic(turns=LengthDist(kind="fixed", value=1), tool_latency=SecondsDist(kind="fixed", value=0.0))
    single = simulate(CLUSTER, _workload(None), _plan(), CM, steps=4, seed=5, token_level=token_level)
    agentic = simulate(CLUSTER, _workload(one), _plan(), CM, steps=4, seed=5, token_level=token_level)
    assert agentic.summary() == single.summary()
    assert agentic.step_times == single.step_times and np.array_equal(agentic.trained_ids, single.trained_ids)
    assert agentic.staleness_hist == single.staleness_hist and agentic.events == single.events


@pytest.mark.parametrize("prefix_cache", [True, False])
@pytest.mark.parametrize("interruptible", [True, False])
def test_the_token_level_reference_agrees_with_the_fast_path_on_episodes(prefix_cache: bool,
                                                                         interruptible: bool) -> None:
    w = _workload(TOOLS.model_copy(update={"prefix_cache": prefix_cache}), interruptible=interruptible)
    fast = simulate(CLUSTER, w, _plan(), CM, steps=5, seed=3)
    ref = simulate(CLUSTER, w, _plan(), CM, steps=5, seed=3, token_level=True)
    assert fast.samples_per_s == pytest.approx(ref.samples_per_s, rel=0.01)
    assert fast.mean_step_s == pytest.approx(ref.mean_step_s, rel=0.01)
    assert fast.utilization == pytest.approx(ref.utilization, rel=0.01)
    assert fast.events * 3 < ref.events  # events grow with turns, not tokens


def test_an_episode_is_trained_whole_and_its_staleness_counts_from_its_first_token() -> None:
    """The trainer's tokens are prompt + every answer + every tool result of the episodes it trains;
    no trained token lags more than the bound, counted from the version the episode started under."""
    w = _workload(TOOLS, eta=1)
    r = simulate(CLUSTER, w, _plan(eta=1), CM, steps=4, seed=2)
    rng = np.random.default_rng(2)
    total = w.samples_per_step * (4 + lag_bound(1) + 1)
    prompts, answers = w.prompt_len.sample(rng, total), w.response_len.sample(rng, total)
    ep = Episodes.draw(TOOLS, w.response_len, answers, 2)
    per_sample = prompts + np.add.reduceat(ep.answer + ep.tool_tokens, ep.first)
    assert r.recorder.step_tokens == [int(per_sample[ids].sum()) for ids in r.recorder.trained]
    assert (ep.turns[r.trained_ids] > 1).any()
    assert max(r.staleness_hist) <= lag_bound(1)


def test_long_tool_calls_idle_the_engines_and_more_samples_in_flight_keep_them_busy() -> None:
    """Episodes that wait 20 s on each tool call free their slots: with only a batch in flight
    (eta 0) the engines idle; a staleness allowance of 4 batches fills them again (Little's law)."""
    slow = TOOLS.model_copy(update={"turns": LengthDist(kind="fixed", value=3),
                                    "tool_latency": SecondsDist(kind="fixed", value=20.0)})
    fast_tools = slow.model_copy(update={"tool_latency": SecondsDist(kind="fixed", value=0.0)})

    def busy(agentic: Agentic, eta: float) -> float:
        r = simulate(CLUSTER, _workload(agentic, eta=eta, prompts=8), _plan(eta=eta, engines=2), CM, steps=6, seed=1)
        return r.utilization["rollout:H20:tp1"]

    idle, quick, more = busy(slow, 0), busy(fast_tools, 0), busy(slow, 4)
    assert idle < 0.6 * quick
    assert more > 1.5 * idle


def test_the_prefix_cache_prefills_only_the_tool_results() -> None:
    """Without prefix caching every turn prefills the whole context again: more prefill time, fewer
    samples/s (same draws)."""
    def run(prefix_cache: bool) -> tuple[float, float]:
        r = simulate(CLUSTER, _workload(TOOLS.model_copy(update={"prefix_cache": prefix_cache})), _plan(), CM,
                     steps=4, seed=3)
        t = r.timeline[r.timeline.activity == "prefill"]
        return float((t.end - t.start).sum()), r.samples_per_s

    (cached_s, cached_rate), (whole_s, whole_rate) = run(True), run(False)
    assert cached_s < 0.6 * whole_s and cached_rate > whole_rate
