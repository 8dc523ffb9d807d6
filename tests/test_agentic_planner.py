"""The planner's analytic rate for agentic episodes (planner.agentic_rate): tool waits by Little's law
on the slots, context growth, and its distance from the simulator."""

from __future__ import annotations

import numpy as np
import pytest

from planner import episode_drain
from planner.candidates import candidates
from planner.milp import solve
from planner.placement import reprice_sync, to_plan
from sim import simulate
from traces import Cluster, CostModel, get_model
from traces.agentic import Agentic, SecondsDist
from traces.lengths import LengthDist
from traces.workload import Workload

CM = CostModel()
CLUSTER = Cluster(name="c", node_groups=({"gpu_type": "H800", "nodes": 1, "gpus_per_node": 8},
                                         {"gpu_type": "H20", "nodes": 1, "gpus_per_node": 8}))
TOOLS = Agentic(turns=LengthDist(kind="uniform", low=1, high=4),
                tool_latency=SecondsDist(kind="lognormal", mean=2.0, sigma=1.0, cap=30.0),
                tool_tokens=LengthDist(kind="lognormal", mean=200, sigma=1.0, cap=1024))


def _workload(agentic: Agentic | None, eta: float = 4) -> Workload:
    return Workload(model=get_model("qwen2.5-1.5b"), prompts_per_step=32, group_size=8,
                    prompt_len=LengthDist(kind="uniform", low=64, high=256),
                    response_len=LengthDist(kind="lognormal", mean=400, sigma=1.0, cap=2048), mode="async",
                    staleness=eta, reward_seconds=0.01, agentic=agentic)


def test_one_turn_without_tools_prices_engines_as_the_single_turn_workload() -> None:
    one = Agentic(turns=LengthDist(kind="fixed", value=1))
    single, agentic = candidates(CM, CLUSTER, _workload(None)), candidates(CM, CLUSTER, _workload(one))
    assert len(single.engines) == len(agentic.engines)
    for a, b in zip(single.engines, agentic.engines, strict=True):
        assert (a.pool, a.tp, a.batch) == (b.pool, b.tp, b.batch)
        assert [x for seg in b.segments for x in seg] == pytest.approx([x for seg in a.segments for x in seg],
                                                                       rel=1e-9)


def test_tool_waits_take_more_episodes_in_flight_for_the_same_busy_slots() -> None:
    """Little's law on the slots: the curve reaches its full rate only at batch + rate x wait in flight;
    longer episodes (more turns, more context) make each one slower to complete."""
    idle = TOOLS.model_copy(update={"tool_latency": SecondsDist(kind="fixed", value=0.0)})
    quick, slow = candidates(CM, CLUSTER, _workload(idle)), candidates(CM, CLUSTER, _workload(TOOLS))
    for a, b in zip(quick.engines, slow.engines, strict=True):
        wait = TOOLS.wait_seconds()
        assert sum(w for w, _ in b.segments) == pytest.approx(b.batch + b.samples_per_s * wait, rel=1e-9)
        assert sum(w for w, _ in a.segments) == pytest.approx(a.batch, rel=1e-9)
        assert b.rate(a.batch) < a.rate(a.batch)  # at the same in-flight count, fewer slots are busy
    single = candidates(CM, CLUSTER, _workload(None))
    assert all(e.samples_per_s < s.samples_per_s for e, s in zip(quick.engines, single.engines, strict=True))


def _analytic_and_simulated(w: Workload, steps: int = 12) -> tuple[float, float]:
    cand = candidates(CM, CLUSTER, w)
    found = solve(cand, w.mode, "throughput", None, None, 1, "auto")
    plan = to_plan(CLUSTER, w, cand, found[0])
    analytic = reprice_sync(CM, CLUSTER, w, cand, found[0], plan).samples_per_s
    return analytic, simulate(CLUSTER, w, plan, CM, steps=steps, seed=0, record_queue=False).samples_per_s


@pytest.mark.parametrize(("mode", "eta"), [("async", 4), ("async", 2), ("async", 1), ("sync", 0)])
def test_the_analytic_rate_is_within_15_percent_of_the_simulated_one(mode: str, eta: float) -> None:
    """At staleness 1 the cohort's longest episode in wall time (decode plus tool waits) sets the cap:
    counting its decode tokens alone put the rate 22% above the simulator's."""
    w = _workload(TOOLS, eta).model_copy(update={"mode": mode})
    analytic, simulated = _analytic_and_simulated(w)
    assert analytic == pytest.approx(simulated, rel=0.15)


@pytest.mark.parametrize(("mode", "eta"), [("async", 4), ("async", 2), ("async", 1), ("sync", 0)])
def test_a_long_tailed_tool_latency_is_priced_by_the_longest_episode_of_the_batch(mode: str, eta: float) -> None:
    """Sigma 2, capped at 120 s: a batch's longest episode waits far more than turns x the mean latency
    (that floor put sync 2.9x above the simulator). 30 steps: 12 leave the long tail's warm-up in."""
    slow = TOOLS.model_copy(update={"tool_latency": SecondsDist(kind="lognormal", mean=2.0, sigma=2.0, cap=120.0)})
    w = _workload(slow, eta).model_copy(update={"mode": mode})
    analytic, simulated = _analytic_and_simulated(w, steps=30)
    assert analytic == pytest.approx(simulated, rel=0.15)


def test_an_episode_alone_drains_in_its_decode_plus_its_tool_wait() -> None:
    """planner.episode_drain: one episode of two turns with a 5 s tool call holds its engine for its
    decode, the tool call and the tool result's prefill, one after another."""
    two = Agentic(turns=LengthDist(kind="fixed", value=2), tool_latency=SecondsDist(kind="fixed", value=5.0),
                  tool_tokens=LengthDist(kind="fixed", value=100))
    w = _workload(two, 0).model_copy(update={"mode": "sync", "response_len": LengthDist(kind="fixed", value=300)})
    per_token, prefill = 0.004, 0.002

    def iteration(busy: np.ndarray) -> np.ndarray:
        return np.full(len(busy), per_token)  # flat: any batch

    def fill(tokens: np.ndarray, cached: np.ndarray) -> np.ndarray:
        return np.full(len(tokens), prefill)

    alone = episode_drain.drain_seconds(w, np.array([1]), iteration, fill)[0]
    assert alone == pytest.approx(prefill + 2 * 300 * per_token + 5.0 + prefill, rel=0.01)
    # eight together at a flat iteration cost take no longer than one: the tool waits overlap
    assert episode_drain.drain_seconds(w, np.array([8]), iteration, fill)[0] == pytest.approx(alone, rel=0.01)


def test_exports_carry_the_episodes_to_verl_and_refuse_them_for_areal() -> None:
    from planner.exports import areal, verl
    from traces import Plan, RolloutGroup, SpecError, TrainerGroup

    w = _workload(TOOLS)
    plan = Plan(mode="async", staleness=4, rollout=(RolloutGroup(gpu_type="H20", tp=1, instances=8),),
                trainer=TrainerGroup(gpu_type="H800", dp=8))
    over = verl.spec(plan, CLUSTER, w)["overrides"]
    prefix = "actor_rollout_ref.rollout.multi_turn"
    for line in (f"{prefix}.enable=True", f"{prefix}.max_assistant_turns=4", f"{prefix}.max_user_turns=3",
                 f"{prefix}.max_tool_response_length=1024", f"data.max_response_length={4 * 2048 + 3 * 1024}"):
        assert line in over
    assert not any("multi_turn" in o for o in verl.spec(plan, CLUSTER, _workload(None))["overrides"])
    with pytest.raises(SpecError, match="agentic episodes"):
        areal.config(plan, CLUSTER, w, ["n0", "n1"])
