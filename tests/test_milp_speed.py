"""The MILP's speed-ups answer as before (issue 19): HiGHS on one thread (planner.solver.HIGHS_THREADS)
gives the answers of HiGHS's own thread count, and still solves where a solve outside the planner
started HiGHS's scheduler with more threads; the fixed point's settled round, continued for the
top-k, gives that MILP's answers solved afresh."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import pulp

from planner import milp, solver
from planner.candidates import Candidates, candidates
from traces import Cluster, CostModel, Workload, get_model
from traces.lengths import LengthDist

T = TypeVar("T")


def _cand() -> Candidates:
    cluster = Cluster(name="threads", node_groups=({"gpu_type": "H800", "nodes": 2}, {"gpu_type": "H20", "nodes": 2},
                                                   {"gpu_type": "L40S", "nodes": 1}))
    workload = Workload(name="threads", model=get_model("qwen2.5-7b"), prompts_per_step=32, group_size=8,
                        prompt_len=LengthDist(kind="uniform", low=64, high=512),
                        response_len=LengthDist(kind="lognormal", mean=1500, sigma=0.9, cap=6144),
                        staleness=2, interruptible=True)
    return candidates(CostModel.roofline_only(), cluster, workload)


def _in_fresh_thread(fn: Callable[[], T]) -> T:
    """HiGHS keeps one task scheduler per thread: each call starts from none."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(fn).result()


def _start_scheduler(threads: int) -> None:
    """A solve outside the planner, in this thread, with `threads` HiGHS threads."""
    prob = pulp.LpProblem("outside", pulp.LpMaximize)
    x = prob.add_variable("x", 0, 10, pulp.LpInteger)
    prob += x
    prob += 2 * x <= 7
    assert pulp.LpStatus[prob.solve(pulp.HiGHS(msg=False, threads=threads))] == "Optimal"


def _top3(cand: Candidates) -> list[milp.Solution]:
    return milp.solve_async(cand, top_k=3)


def test_one_thread_answers_as_highs_own_thread_count(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    cand = _cand()
    one = _in_fresh_thread(lambda: _top3(cand))
    monkeypatch.setattr(solver, "HIGHS_THREADS", 0)  # HiGHS's own choice (2 threads on 2 cores)
    own = _in_fresh_thread(lambda: _top3(cand))
    assert len(one) == 3 and math.isfinite(one[0].lp_bound)
    assert [(s.trainer, s.engines) for s in one] == [(s.trainer, s.engines) for s in own]
    assert [s.samples_per_s for s in one] == [s.samples_per_s for s in own]


def test_a_solve_runs_where_highs_was_started_with_more_threads() -> None:
    cand = _cand()
    fresh = _in_fresh_thread(lambda: _top3(cand))

    def after_outside() -> list[milp.Solution]:
        _start_scheduler(2)  # HiGHS refuses a later solve asking for one thread in this thread
        return _top3(cand)

    assert _in_fresh_thread(after_outside) == fresh


def _relaxed_start(cand: Candidates) -> tuple[float, float]:
    """Where a search given no start rate starts: the fixed point of the LP relaxation, each round a
    fresh lp_bound at the last round's derating."""
    rate = milp.lp_bound(cand, "throughput", None, None)
    for _ in range(milp.FIXED_POINT_ROUNDS):
        derated = dataclasses.replace(cand, engines=tuple(o.derated(cand.samples_per_step / rate)
                                                          for o in cand.engines))
        last, rate = rate, milp.lp_bound(derated, "throughput", None, None)
        if abs(rate - last) <= 0.01 * rate:
            break
    return cand.samples_per_step / rate, rate


def test_a_ranking_relaxation_is_lp_bound_of_its_options() -> None:
    """_Ranking.relaxation solves its own model without integrality: lp_bound's value, at the start
    and after a reslope to another period's derating."""
    cand = _cand()
    ranking = milp._Ranking(cand, "throughput", None, None, "auto", None)
    assert ranking.relaxation() == milp.lp_bound(cand, "throughput", None, None)
    derated = dataclasses.replace(cand, engines=tuple(o.derated(cand.samples_per_step / 5.0) for o in cand.engines))
    ranking.reslope(derated)
    relaxed = ranking.relaxation()
    assert relaxed == milp.lp_bound(derated, "throughput", None, None)
    assert relaxed < milp.lp_bound(cand, "throughput", None, None)  # a short period loses rate to updates
    assert ranking.top(1, math.nan)[0].samples_per_s <= relaxed * (1 + 1e-9)  # the MILP is under its LP


def test_the_settled_round_ranks_as_the_same_milp_solved_afresh() -> None:
    """solve_async continues the fixed point's settled round for its top-k: the answers of that
    MILP solved again from scratch at the settled period."""
    cand = _cand()
    assert any(o.update_seconds for o in cand.engines)  # interruptible: the fixed point runs
    got = milp.solve_async(cand, top_k=3)
    period, last = _relaxed_start(cand)
    for _ in range(milp.FIXED_POINT_ROUNDS):  # the rounds, one fresh MILP each
        derated = dataclasses.replace(cand, engines=tuple(o.derated(period) for o in cand.engines))
        rate = milp.solve_async_fixed(derated, top_k=1, bound=False)[0].samples_per_s
        if abs(rate - last) <= 0.01 * rate:
            break
        period, last = cand.samples_per_step / rate, rate
    else:
        raise AssertionError("this fleet's fixed point settles")
    fresh = milp.solve_async_fixed(derated, top_k=3)
    base = {id(d): o for d, o in zip(derated.engines, cand.engines, strict=True)}
    want = [milp.settled(cand, s, tuple((base[id(o)], n) for o, n in s.engines)) for s in fresh]
    assert len(got) == 3 and got == want


def _problem(prob: pulp.LpProblem) -> dict[str, object]:
    """PuLP's dict of a problem less what a solve wrote into it (values, duals, slacks, status)."""
    solved = {"varValue", "dj", "pi", "slack", "status", "sol_status"}

    def strip(item: object) -> object:
        if isinstance(item, dict):
            return {k: strip(v) for k, v in item.items() if k not in solved}
        if isinstance(item, list):
            return [strip(v) for v in item]
        return item

    return strip(prob.toDict())  # type: ignore[return-value]


def test_a_reslope_model_is_the_model_built_for_the_next_round() -> None:
    """The fixed point keeps one MILP and changes its generation row per round: the very problem
    _build makes for that round's derating (PuLP's dict of it: the rows HiGHS is given)."""
    cand = _cand()
    ranking = milp._Ranking(cand, "throughput", None, None, "auto", None)
    rate = ranking.top(1, math.nan)[0].samples_per_s
    derated = dataclasses.replace(cand, engines=tuple(o.derated(cand.samples_per_step / rate) for o in cand.engines))
    assert derated.engines != cand.engines  # the slopes moved
    ranking.reslope(derated)
    fresh = milp._build(derated, "throughput", None, None, list(range(len(cand.trainers))),
                        list(range(len(cand.engines))), relax=False, in_flight=cand.in_flight_cap(0.0, 0.0), tail=True)
    assert _problem(ranking.model.prob) == _problem(fresh.prob)
    assert ranking.top(2, math.nan) == milp._Ranking(derated, "throughput", None, None, "auto", None).top(2, math.nan)
