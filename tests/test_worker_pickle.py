"""A request's workers name the cost model they inherited by its id, both ways (planner.parallel):
a MILP's answer holds engine options whose drain curves hold the cost model, and those tables were
pickled back with every answer (issue 19: 57 MB of the demo's answers). An answer that cannot be
read back raises a clear error from its future instead of leaving the caller waiting."""

from __future__ import annotations

import pickle

import pytest

from planner.candidates import candidates
from planner.milp import solve
from planner.parallel import _INHERITED, Simulations, SolveJob, WorkerAnswerError, _dumps, light_cost_model, solve_job
from traces import Cluster, CostModel, Workload, get_model
from traces.lengths import LengthDist

CM = CostModel()  # the shipped tables: what a request inherits (the placeholder would pickle small anyway)


def _fleet() -> Cluster:
    return Cluster(name="pickle-small", node_groups=({"gpu_type": "H800", "nodes": 1}, {"gpu_type": "H20", "nodes": 1}))


def _workload() -> Workload:
    return Workload(name="pickle-small", model=get_model("qwen2.5-1.5b"), prompts_per_step=16, group_size=8,
                    prompt_len=LengthDist(kind="uniform", low=64, high=256),
                    response_len=LengthDist(kind="lognormal", mean=600, sigma=0.8, cap=2048),
                    staleness=2, interruptible=False)


def _holding(cm: CostModel) -> tuple[CostModel, int]:
    return cm, 7


def _unreadable() -> object:
    return _Unreadable()


class _Unreadable:
    """Pickles in the worker; unpickling it (in the parent) fails."""

    def __reduce__(self) -> tuple[object, tuple[()]]:
        return _refuse, ()


def _refuse() -> None:
    raise ValueError("refused on purpose")


def test_the_inherited_cost_model_is_pickled_as_its_id() -> None:
    sims = Simulations(2)
    try:
        sims.start(CM)
        whole = len(pickle.dumps(CM))
        assert whole > 100_000  # the tables: what each answer carried before
        assert len(_dumps((CM, 1), CM)) < 200
        assert len(_dumps((CostModel.roofline_only(), 1), CM)) < whole  # another one: pickled whole, still works
        # a call naming it, and an answer holding it, come back as this process's own object
        cm, seven = sims.submit(_holding, CM).result(timeout=120)
        assert cm is CM and seven == 7
    finally:
        sims.close()


def test_a_milp_answer_from_a_worker_is_small_and_the_serial_answer() -> None:
    cand = candidates(CM, _fleet(), _workload())
    serial = solve(cand, "async", "throughput", None, None, 2)
    assert serial
    sims = Simulations(2)
    try:
        sims.start(CM)
        job = SolveJob(None, "async", "throughput", None, None, 2, "auto", fleet=(light_cost_model(), _fleet(),
                                                                                    _workload()),
                       inherited=sims.inherited(CM))
        found, hit = sims.submit(solve_job, job).result(timeout=300)
        assert hit is None
        assert found == serial  # same options, counts and figures
        assert all(o.drain_source is None or o.drain_source._args[0] is CM for s in found for o, _ in s.engines)
        assert len(pickle.dumps(found)) > 100_000 > len(_dumps(found, CM))  # whole tables vs by id
    finally:
        sims.close()


def test_an_unreadable_answer_raises_a_clear_error_not_a_hang() -> None:
    sims = Simulations(2)
    try:
        sims.start(CM)
        with pytest.raises(WorkerAnswerError, match=r"_unreadable.*could not be unpickled.*refused on purpose"):
            sims.submit(_unreadable).result(timeout=120)
        assert sims.submit(_holding, CM).result(timeout=120)[1] == 7  # the pool still answers
    finally:
        sims.close()


def test_an_id_this_process_does_not_hold_is_named() -> None:
    stale = CostModel.roofline_only()
    _INHERITED[id(stale)] = stale
    data = _dumps(stale, stale)
    del _INHERITED[id(stale)]
    with pytest.raises(WorkerAnswerError, match=f"inherited cost model {id(stale)}"):
        pickle.loads(data)
