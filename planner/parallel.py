"""Simulations and MILPs of independent plans in worker processes, with the results a serial run gives.

A request simulates its top plans, each engine-mix round's trials and its baselines: each a seeded
simulation of its own plan, independent of the others, so they can run side by side; the same
holds for its independent MILPs (an engine-mix round's rule moves, the baselines' fleets, the
marginal values' fleets). Workers are forked (they inherit the loaded cost tables, no re-import)
once per request, all at once (`start`) and before the request's threads run, so no child
inherits a lock a thread holds; results come back in submission order, so a parallel request
returns what a serial one does, bit for bit (tests/test_plan_speed.py).
A MILP in a worker runs in a thread of its own (`solve_job`): HiGHS keeps its task scheduler per
thread (HiGHS PR #818), and the forked child's main thread holds a copy of the parent's, whose
worker threads the child does not have.
Calls and answers (`submit`) name the cost model the workers inherited by its id, both ways: a
MILP's answer holds engine options whose drain curves hold the cost model (planner.drain.LazyDrain),
and pickling its tables with each answer was 57 MB of the demo's 48 answers, 1.8 MB without them.
An answer this process cannot read back raises WorkerAnswerError from its future.
"""

from __future__ import annotations

import copyreg
import dataclasses
import functools
import io
import multiprocessing
import pickle
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from planner.bounds import Deadline
from planner.candidates import Candidates, candidates
from planner.executors import cores, in_sweep_worker
from planner.frameworks import solver_for
from planner.milp import Mode, Objective, Solution, solve
from sim import SimResult, simulate
from sim.warm_up import warm_up
from traces import Cluster, CostModel, Plan, SpecError, Workload

T = TypeVar("T")

MAX_WORKERS = 8  # more would only queue: a request rarely has more independent plans at once


@dataclass(frozen=True)
class SimJob:
    """One simulation: what `sim.simulate` is called with."""

    cluster: Cluster
    workload: Workload
    plan: Plan
    cm: CostModel
    steps: int
    seed: int
    wall_seconds: float
    until_settled: bool = False  # `steps` is a settling run's cap (sim.simulate)

    def key(self) -> str:
        """The placement simulated (fleet, job, plan): seeded, the same key is the same result."""
        return f"{self.cluster.model_dump_json()}|{self.workload.model_dump_json()}|{self.plan.model_dump_json()}"


def run_job(job: SimJob) -> SimResult | SpecError:
    """The job's simulation, or the SpecError it raised (returned: the caller decides, in order)."""
    try:
        return simulate(job.cluster, job.workload, job.plan, job.cm, steps=job.steps, seed=job.seed,
                        record_queue=False, wall_seconds=job.wall_seconds,
                        until_settled=job.until_settled)
    except SpecError as err:
        return err


@dataclass(frozen=True)
class SolveJob:
    """One MILP: planner.milp.solve's arguments (`framework`: its restricted solver, planner.frameworks;
    `fleet`: when `cand` is None, the candidates of this cost model, fleet and job, computed in the worker)."""

    cand: Candidates | None
    mode: Mode
    objective: Objective
    budget: float | None
    target: float | None
    top_k: int
    solver: str
    deadline: Deadline | None = None
    framework: str | None = None
    fleet: tuple[CostModel, Cluster, Workload] | None = None  # (cost model, fleet, job) when `cand` is None
    inherited: int | None = None  # the id of the worker's inherited cost model, used for `fleet`'s placeholder
    start_rate: float | None = None  # where the async fixed point starts (planner.milp.solve_async)


def solve_job(job: SolveJob) -> tuple[list[Solution], str | None]:
    """The job's MILP answer and the first bound it hit (a worker's copy of the request's Deadline
    notes its own), solved in a fresh thread (see the module docstring)."""
    with ThreadPoolExecutor(1) as thread:
        return thread.submit(_solve_here, job).result()


def _solve_here(job: SolveJob) -> tuple[list[Solution], str | None]:
    cand = job.cand
    if cand is None:
        assert job.fleet is not None, "a SolveJob names its candidates or its fleet"
        cm, cluster, workload = job.fleet
        # the inherited cost model: no tables pickled, and its engine curves known (planner.memo)
        cand = candidates(cm if job.inherited is None else _INHERITED[job.inherited], cluster, workload)
    fn = solver_for(job.framework) if job.framework else solve
    found = fn(cand, job.mode, job.objective, job.budget, job.target, job.top_k, job.solver, deadline=job.deadline,
               start_rate=job.start_rate)
    return found, job.deadline.hit if job.deadline is not None else None


_INHERITED: dict[int, CostModel] = {}  # cost models a pool's workers inherited when it forked them, by id


def _run_inherited(cm: int, job: SimJob) -> SimResult | SpecError:
    """`run_job` with the cost model this worker inherited (sent by id: a job pickles no tables, and
    every job of a worker simulates with one object, whose engine tables sim.simulate keeps)."""
    return run_job(dataclasses.replace(job, cm=_INHERITED[cm]))


class WorkerAnswerError(RuntimeError):
    """A worker's call or answer that could not be read back (a bug, not the request's fault)."""


def _dumps(obj: Any, cm: CostModel | None) -> bytes:
    """`obj` pickled with `cm` (the cost model the pool's workers inherited, if any) named by its id."""
    buf = io.BytesIO()
    pickler = pickle.Pickler(buf, pickle.HIGHEST_PROTOCOL)
    if cm is not None:  # only CostModel instances reach this reducer (a dispatch table is by type)
        pickler.dispatch_table = {**copyreg.dispatch_table, CostModel: functools.partial(_by_id, cm)}
    pickler.dump(obj)
    return buf.getvalue()


def _by_id(inherited: CostModel, cm: CostModel) -> str | tuple[Any, ...]:
    """The inherited cost model as its id; any other pickled whole (its default reduction)."""
    if cm is inherited:
        return _inherited_cost_model, (id(cm),)
    return cm.__reduce_ex__(pickle.HIGHEST_PROTOCOL)


def _inherited_cost_model(key: int) -> CostModel:
    """The cost model pickled as its id (`_dumps`): this process's (the parent's, or a worker's copy)."""
    cm = _INHERITED.get(key)
    if cm is None:
        raise WorkerAnswerError(f"a pickled call or answer names inherited cost model {key}, which this process "
                                "does not hold (was its pool closed before the answer was read?)")
    return cm


def _call(call: bytes, inherited: int | None) -> bytes:
    """A call Simulations.submit pickled: run it, its answer pickled with the inherited cost model by id."""
    fn, args = pickle.loads(call)
    return _dumps(fn(*args), None if inherited is None else _inherited_cost_model(inherited))


def _read(answer: Future[bytes], out: Future[Any], name: str) -> None:
    """`answer`'s bytes unpickled into `out` (a done callback: whatever fails is set on `out`, so the
    caller's .result() raises it instead of waiting for a result no one sets)."""
    try:
        if answer.cancelled():
            out.cancel()
            return
        err = answer.exception()
        if err is not None:
            out.set_exception(err)
            return
        try:
            out.set_result(pickle.loads(answer.result()))
        except Exception as exc:
            raise WorkerAnswerError(f"the answer of {name} from a worker could not be unpickled: "
                                    f"{type(exc).__name__}: {exc}") from exc
    except BaseException as exc:
        if not out.done():
            out.set_exception(exc)


def _ready() -> None:
    """A worker's first job: nothing (submitted once per worker, it makes the pool fork them all now)."""


@functools.cache
def light_cost_model() -> CostModel:
    """A placeholder cost model, small to pickle (a job's own is the worker's inherited one)."""
    return CostModel.roofline_only()


class Simulations:
    """Runs batches of SimJobs (and SolveJobs): in `workers` forked processes, or in this one when
    workers is 1."""

    def __init__(self, workers: int | None = None) -> None:
        if workers is None and in_sweep_worker():  # a sweep's worker: the sweep spreads over the cores
            workers = 1
        self.workers = max(1, min(MAX_WORKERS, cores() if workers is None else workers))
        if multiprocessing.current_process().daemon:  # a daemon (a multiprocessing.Pool worker) may not fork
            self.workers = 1
        self._pool: ProcessPoolExecutor | None = None
        self._inherit: CostModel | None = None  # the cost model this pool's workers inherited (`start`)

    def run(self, jobs: list[SimJob]) -> list[SimResult | SpecError]:
        if self.workers == 1 or len(jobs) < 2:
            return [run_job(j) for j in jobs]
        pool = self._executor()
        futures: list[Future[SimResult | SpecError]] = [
            pool.submit(_run_inherited, id(j.cm), dataclasses.replace(j, cm=light_cost_model()))
            if j.cm is self._inherit
            else pool.submit(run_job, j) for j in jobs]
        return [f.result() for f in futures]

    def start(self, cm: CostModel | None = None, warm: bool = False) -> None:
        """Fork the workers now (all of them: a fork start method spawns the whole pool at the first
        submission), while the request runs no threads of its own; they inherit `cm`, which the
        request's simulations then name by id instead of pickling it (1 MB of tables) per job.
        `warm`: each worker first loads the simulator's compiled kernels (sim.warm_up), while this
        process goes on (its own MILP), not waited for."""
        if self.workers == 1 or self._pool is not None:
            return
        if cm is not None:
            _INHERITED[id(cm)] = self._inherit = cm
        pool = self._executor()
        pool.submit(_ready).result()
        if warm:
            for _ in range(self.workers):  # idle workers take one each
                pool.submit(warm_up)

    def inherited(self, cm: CostModel) -> int | None:
        """The id a job may name `cm` by, if this pool's workers inherited it (`start`)."""
        return id(cm) if self.workers > 1 and cm is self._inherit else None

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """`fn(*args)` in a worker (in this process, done, when workers is 1). The call is pickled
        here, before returning: the pool's feeder thread would pickle it later, while this thread
        goes on filling the caches of the cost model the arguments hold ("dictionary changed size
        during iteration", found by tests/test_fuzz.py)."""
        if self.workers == 1:
            done: Future[T] = Future()
            done.set_result(fn(*args))
            return done
        inherited = id(self._inherit) if self._inherit is not None else None
        answer = self._executor().submit(_call, _dumps((fn, args), self._inherit), inherited)
        out: Future[T] = Future()
        answer.add_done_callback(functools.partial(_read, out=out, name=getattr(fn, "__qualname__", repr(fn))))
        return out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        if self._inherit is not None:
            _INHERITED.pop(id(self._inherit), None)
            self._inherit = None

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("fork"))
        return self._pool
