"""Where a sweep's independent jobs run: in this process (`serial`), in local processes (`processes`),
or as Ray tasks on a cluster (`ray`).

A sweep is a `Job`: `setup(payload)` builds what every item shares (once per worker), `work(context,
item)` answers one item. Both are module-level functions and the payload and items are plain data
(the pydantic specs as their dicts), so every executor runs the same code on the same inputs: with
seeded simulations the results are identical wherever they ran, and they come back in input order.

A SpecError raised by an item is re-raised here as the same one line (the first failing item in
input order), not as a worker's traceback. Ray workers import these functions by name: on a cluster
of several machines every node needs this rlfleet installed (`pip install 'rlfleet[runtime]'`); a
local Ray started here runs with this process's environment.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import pickle
import sys
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from traces import SpecError
from traces.progress import bar, set_quiet
from traces.ray_address import LOOPBACK_ENV, check_ray_address, probe_ray_address

KINDS = ("auto", "serial", "processes", "ray")
# a local Ray's object store: a sweep ships specs of a few kB per item (Ray's default takes 30% of RAM)
OBJECT_STORE_BYTES = 256 * 1024**2

C = TypeVar("C")
T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class Executor:
    """`auto`: local processes when this process may use more than one core and there is more than one
    item, else serial (Ray when `ray_address` is given). `ray_address` None with `ray`: the Ray this
    process already joined, else a new local one on loopback (never a cluster another user started)."""

    kind: str = "auto"
    ray_address: str | None = None
    workers: int | None = None  # processes at most (default: the cores this process may use)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise SpecError(f"executor {self.kind!r}: choose one of {', '.join(KINDS)}")
        if self.ray_address is not None:
            check_ray_address(self.ray_address)
            if self.kind not in ("auto", "ray"):
                raise SpecError(f"a Ray address runs the sweep on Ray: drop it, or use executor 'ray' "
                                f"instead of {self.kind!r}")
        if self.workers is not None and self.workers < 1:
            raise SpecError(f"executor workers must be at least 1, got {self.workers}")

    def resolve(self, items: int) -> str:
        """The executor that runs `items` items."""
        if self.kind != "auto":
            return self.kind
        if self.ray_address is not None:
            return "ray"
        return "processes" if items > 1 and min(cores(), self.workers or items) > 1 else "serial"


def as_executor(executor: Executor | str | None) -> Executor:
    """An `executor=` argument: an Executor, one of KINDS, or None (auto)."""
    if executor is None:
        return Executor()
    if isinstance(executor, Executor):
        return executor
    return Executor(kind=executor)


@dataclass(frozen=True)
class Job(Generic[C, T, R]):
    setup: Callable[[Any], C]  # payload -> what every item shares (module level: pickled by name)
    work: Callable[[C, T], R]  # one item's answer (module level)
    payload: Any  # plain data, shipped once per worker


def run(job: Job[C, T, R], items: Sequence[T], executor: Executor | str | None = None, desc: str = "sweep") -> list[R]:
    """`job.work` on every item, results in input order, on `executor` (see Executor)."""
    chosen = as_executor(executor)
    items = list(items)
    kind = chosen.resolve(len(items))
    if not items:
        return []
    with bar(len(items), f"{desc} ({kind})") as progress:
        if kind == "serial":
            results = _serial(job, items, progress)
        elif kind == "processes":
            results = _processes(job, items, chosen.workers or cores(), progress)
        else:
            results = _ray(job, items, chosen.ray_address, progress)
    for result in results:
        if isinstance(result, _Failed):
            raise SpecError(result.message)
    return results


def cores() -> int:
    """The cores this process may use (its affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class _Failed:
    message: str  # an item's SpecError, raised again by the caller


def _guarded(work: Callable[[C, T], R], context: C, item: T) -> R | _Failed:
    try:
        return work(context, item)
    except SpecError as exc:
        return _Failed(str(exc))


def _serial(job: Job[C, T, R], items: list[T], progress: Any) -> list[Any]:
    context = job.setup(job.payload)
    results: list[Any] = []
    for item in items:
        results.append(_guarded(job.work, context, item))
        progress.update()
        if isinstance(results[-1], _Failed):  # the caller raises it: the rest need not run
            break
    return results


# ---- local processes -------------------------------------------------------------------------------
# One pool per process, reused by every sweep (a notebook sweeps many times; a worker's start, its
# imports and compiled kernels, is seconds). Each task carries the sweep's payload pickled once, as
# bytes, with the sweep's key: a worker unpickles and sets it up the first time it meets the key.
_pool: tuple[int, ProcessPoolExecutor] | None = None
_worker_context: tuple[str, Any] | None = None  # a worker's (sweep key, context): the last sweep only
_in_worker = False  # this process runs a sweep's items (a local worker or a Ray task)


def in_sweep_worker() -> bool:
    """Whether this process is one of a sweep's workers: the sweep already spreads its items over the
    cores, so a plan inside one simulates in place (planner.parallel)."""
    return _in_worker


def _process_work(setup: Callable[[Any], Any], work: Callable[[Any, Any], Any], key: str, payload: bytes,
                  item: Any) -> Any:
    global _worker_context, _in_worker
    _in_worker = True
    if _worker_context is None or _worker_context[0] != key:
        set_quiet(True)  # one bar, the caller's
        _worker_context = (key, setup(pickle.loads(payload)))
    return _guarded(work, _worker_context[1], item)


def _worker_pool(workers: int) -> ProcessPoolExecutor:
    global _pool
    if _pool is None or _pool[0] != workers:
        if _pool is not None:
            _pool[1].shutdown(wait=False, cancel_futures=True)
        # spawn, not fork: the caller may hold threads (tqdm's monitor, HiGHS, numba, Ray), and a forked
        # child of a threaded process can deadlock on a lock one of them held. Workers start on demand.
        _pool = (workers, ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")))
    return _pool[1]


def _processes(job: Job[C, T, R], items: list[T], workers: int, progress: Any) -> list[Any]:
    global _pool
    pool, key, payload = _worker_pool(workers), uuid.uuid4().hex, pickle.dumps(job.payload)
    try:
        futures = [pool.submit(_process_work, job.setup, job.work, key, payload, item) for item in items]
        for _ in as_completed(futures):
            progress.update()
        return [f.result() for f in futures]
    except BrokenProcessPool:  # a worker died (killed, out of memory): the next sweep starts a new pool
        _pool = None
        raise


# ---- Ray ---------------------------------------------------------------------------------------------
_ray_context: tuple[str, Any] | None = None  # a Ray worker's (payload object id, context): the last one only


def _ray_work(setup: Callable[[Any], Any], work: Callable[[Any, Any], Any], boxed: list[Any], item: Any) -> Any:
    """One Ray task. The payload's reference comes boxed in a list so Ray does not fetch it for every
    task: a worker process builds the context once per payload and keeps it for the next task."""
    import ray

    global _ray_context, _in_worker
    _in_worker = True
    key = boxed[0].hex()
    if _ray_context is None or _ray_context[0] != key:
        set_quiet(True)
        _ray_context = (key, setup(ray.get(boxed[0])))
    return _guarded(work, _ray_context[1], item)


def join_ray(address: str | None) -> Any:
    """The `ray` module, joined to `address`, or to the Ray this process already joined, or to a new
    local one on loopback; SpecError (one line) if Ray is not installed or the address does not answer."""
    if address is not None:
        probe_ray_address(address, "use executor 'processes'")
    if address is None and "ray" not in sys.modules:
        os.environ.setdefault(LOOPBACK_ENV, "0")
    try:
        import ray
    except ImportError:
        raise SpecError("executor 'ray' needs Ray: pip install 'rlfleet[runtime]', or use executor "
                        "'processes'") from None
    if ray.is_initialized():  # the Ray this process joined wins (an address given must still answer)
        return ray
    try:
        # address="local": a new instance; without it ray.init joins whatever cluster this machine
        # last started, which may be someone else's
        if address is None:
            ray.init(address="local", include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING,
                     object_store_memory=OBJECT_STORE_BYTES)
        else:
            ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        target = "a local Ray" if address is None else f"the Ray cluster at {address}"
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SpecError(f"could not join {target}: {first}; start one with `ray start --head` and pass "
                        "its address, or use executor 'processes'") from None
    return ray


def _ray(job: Job[C, T, R], items: list[T], address: str | None, progress: Any) -> list[Any]:
    ray = join_ray(address)
    boxed = [ray.put(job.payload)]
    task = ray.remote(num_cpus=1)(_ray_work)
    refs = [task.remote(job.setup, job.work, boxed, item) for item in items]
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        progress.update(len(done))
    return list(ray.get(refs))
