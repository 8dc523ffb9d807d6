"""Simulations of independent plans in worker processes, with the results a serial run gives.

A request simulates its top plans, each engine-mix round's trials and its baselines: each a seeded
simulation of its own plan, independent of the others, so they can run side by side. Workers are
forked (they inherit the loaded cost tables and the compiled simulator kernels, no re-import) when
the request starts, once per request; results come back in submission order, so a parallel
request returns what a serial one does, bit for bit (tests/test_plan_speed.py).
Only simulations run in workers: the MILP stays in the request's process (HiGHS keeps threads of
its own, which a forked child must not inherit mid-use).
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass

from planner.executors import cores, in_sweep_worker
from sim import SimResult, simulate
from traces import Cluster, CostModel, Plan, SpecError, Workload

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


class Simulations:
    """Runs batches of SimJobs: in `workers` forked processes, or in this one when workers is 1."""

    def __init__(self, workers: int | None = None) -> None:
        if workers is None and in_sweep_worker():  # a sweep's worker: the sweep spreads over the cores
            workers = 1
        self.workers = max(1, min(MAX_WORKERS, cores() if workers is None else workers))
        if multiprocessing.current_process().daemon:  # a daemon (a multiprocessing.Pool worker) may not fork
            self.workers = 1
        self._pool: ProcessPoolExecutor | None = None

    def run(self, jobs: list[SimJob]) -> list[SimResult | SpecError]:
        if self.workers == 1 or len(jobs) < 2:
            return [run_job(j) for j in jobs]
        pool = self._executor()
        futures: list[Future[SimResult | SpecError]] = [pool.submit(run_job, j) for j in jobs]
        return [f.result() for f in futures]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("fork"))
        return self._pool
