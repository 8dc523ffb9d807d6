"""The async loop on Ray: rollout engines and the trainer are actors, weights travel over gloo.

Processes:
- one `EngineWorker` actor per rollout engine and one `TrainerWorker` actor per trainer rank, placed
  with `runtime.placement.place` (one placement group per plan group, pinned to its GPU type). With
  the plan's trainer dp > 1 the ranks are `runtime.parallel.DataParallelTrainer` replicas in a
  torch.distributed group of their own (rank 0 hosts its store): each step the batch is put in Ray's
  store once and every rank trains on it; rank 0's stats stand for the step (they are global). Only
  rank 0 is in the weight-sync group and writes checkpoints; on resume every rank loads that file.
  dp = 1 is the plain `Trainer`, with no process group;
- this process, the driver, runs the shared `Controller` (capacity rule, routing of whole GRPO
  groups, staleness-safe batch selection, records) and calls the actors.

Each tick the driver routes, then runs one continuous-batching iteration on every engine at once
(one call per engine, with the requests routed to it, answered with its completions, busy intervals
and status). Training overlaps generation: a ready batch goes to the trainer as a future and the
engines keep ticking until it is done. The weights then go to every engine in one collective
(runtime.sync: the trainer broadcasts, every engine receives) and the controller moves to the new
version. Only one step is in flight at a time, as the in-process loop: the capacity rule and the
selection count versions the engines have received.

Times in the timeline come from `time.time()` in every process: perf_counter origins differ
between processes, the wall clock is shared (on a cluster, as well as the nodes' clocks agree).

Faults. A dead actor surfaces as `ray.exceptions.RayActorError` from `ray.get`.
- An engine that dies: its samples in flight go back to the controller to be generated again
  (runtime.controller: none lost, none trained twice, the staleness bound unchanged), and a new
  actor starts on the same placement-group bundle. The gloo sync group has a fixed world size and
  a dead rank breaks it (the sender fails at once, the other receivers wait out the group's
  timeout), so the group is rebuilt, on a new store and port, before the next broadcast: with the
  survivors alone, and again when the new engine is up (it gets the current weights then, and
  takes work once it holds the current version). Survivors skip a broadcast of a version they hold.
- The trainer that dies (any of its dp ranks: the others would wait for it in a collective): the
  run stops with `TrainerLost`, naming the last committed checkpoint;
  `rlfleet run PLAN --resume DIR` continues from it (runtime.records, Controller.restore).
`Faults` injects either for tests and drills: real `ray.kill`s at set points of the loop.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from runtime.controller import Controller, LoopConfig
from runtime.engine import Completion, Interval, Request, TorchEngine
from runtime.loop import RunResult, evaluate, summarize, toy_setup
from runtime.model import CharTokenizer, load_model
from runtime.parallel import DataParallelTrainer, init_dp_group
from runtime.placement import TYPE_RESOURCE, Group, place
from runtime.records import RunRecorder
from runtime.sync import DEFAULT_BUCKET_BYTES, SyncGroup, WeightReceiver, WeightSender
from runtime.task import AdditionTask
from runtime.trainer import Rollout, StepStats, TrainConfig, Trainer
from traces import Plan, RolloutGroup, SpecError, TrainerGroup

LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": Ray takes 127.0.0.1 as the node address
TOY_GPU_TYPE = "CPU"  # the toy plan's type label; on CPU only a custom resource on the local node
# how long a sync rank waits for the others (a rendezvous, a broadcast): it bounds the stall when a rank
# dies mid-broadcast, and must exceed the slowest real broadcast (large models on slow links)
SYNC_TIMEOUT_S = 300.0
MAX_ENGINE_RESTARTS = 8  # per run: an engine that keeps dying is a bug or a bad node, not bad luck
SYNC_ATTEMPTS = 3  # rebuild-and-broadcast tries before the run gives up


class TrainerLost(RuntimeError):
    """The trainer actor died; the run can continue from its last checkpoint with `--resume`."""


@dataclass(frozen=True)
class Faults:
    """Real faults injected at set points of the loop, for tests and drills (`ray.kill`, no restart).

    Each fires once. Steps count synced versions: `kill_engine=(0, 3)` kills engine 0 as soon as
    version 3 is on the engines; `kill_trainer=3` kills the trainer while it trains step 3 (which
    would make version 4).
    """

    kill_engine: tuple[int, int] | None = None  # (engine index, version)
    kill_engine_in_sync: tuple[int, int] | None = None  # (engine index, version): just before it is broadcast
    kill_trainer: int | None = None  # step
    kill_trainer_rank: int = 0  # which data-parallel rank `kill_trainer` kills


@dataclass(frozen=True)
class EngineStatus:
    """An engine's routing view after a call: `accepts` is the version new requests would start at."""

    accepts: int | None  # None: draining before a weight load, takes nothing new
    load: int
    capacity: int
    idle: bool  # no request and no weight load waiting: a step would do nothing


def _model(model: PreTrainedModel | str) -> PreTrainedModel:
    return load_model(model) if isinstance(model, str) else model


class EngineWorker:
    """A `TorchEngine` in its own process, one sync-group rank. Plain class; `ray.remote` wraps it."""

    def __init__(self, model: PreTrainedModel | str, eos_id: int, pad_id: int, name: str, max_batch: int,
                 seed: int, interruptible: bool, threads: int = 1) -> None:
        torch.set_num_threads(threads)  # a busy small machine: OpenMP spinning costs more than it gains
        self.engine = TorchEngine(_model(model), eos_id, pad_id, name=name, max_batch=max_batch, seed=seed,
                                  interruptible=interruptible, clock=time.time)
        self._received = self.engine.version  # the last version loaded or queued
        self._receiver: WeightReceiver | None = None

    def join_sync(self, host: str, port: int, rank: int, world_size: int,
                  bucket_bytes: int = DEFAULT_BUCKET_BYTES, timeout_s: float = SYNC_TIMEOUT_S) -> None:
        """Join a (new) sync group; a previous group, broken by a dead rank, is dropped."""
        self._receiver = None
        group = SyncGroup(host, port, rank, world_size, timeout_s=timeout_s)
        self._receiver = WeightReceiver(group, self.engine.model.state_dict(), bucket_bytes)

    def receive_weights(self) -> EngineStatus:
        """Take part in one weight broadcast; the weights apply at the engine's next iteration boundary.

        A version already held is not loaded again: after a fault the group re-broadcasts the current
        version for a new engine, and reloading would make the others re-prefill for nothing."""
        assert self._receiver is not None, "join_sync first"
        state, version = self._receiver.receive()
        if version != self._received:
            self.engine.load_weights(state, version)  # copies them: the receiver overwrites its tensors next time
            self._received = version
        return self.status()

    def step(self, requests: Sequence[Request]) -> tuple[list[Completion], list[Interval], EngineStatus]:
        self.engine.submit(requests)
        completions = self.engine.step()
        return completions, self.engine.drain_intervals(), self.status()

    def status(self) -> EngineStatus:
        e = self.engine
        accepts = next((v for v in (self._received, e.version) if e.accepting(v)), None)
        # queued weights apply only inside step(): an engine holding some is not idle, or a draining
        # engine with no rows left would never load them and never accept again
        return EngineStatus(accepts, e.load(), e.capacity(), e.idle() and e.version == self._received)

    def weights(self) -> dict[str, torch.Tensor]:
        return {k: v.clone() for k, v in self.engine.model.state_dict().items()}

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()


class TrainerWorker:
    """One trainer rank in its own process. Rank 0 is the sync group's rank 0 (it hosts its store and
    sends the weights) and writes the checkpoints; with dp > 1 every rank is a `DataParallelTrainer`
    replica, built only once the dp group is formed (`open_dp`, then `join_dp` on every rank at once)."""

    def __init__(self, model: PreTrainedModel | str, pad_id: int, config: TrainConfig, seed: int,
                 threads: int = 1, rank: int = 0, dp: int = 1) -> None:
        torch.set_num_threads(threads)
        torch.manual_seed(seed)
        self.rank, self.dp = rank, dp
        self._args = (_model(model), pad_id, config, seed)
        # dp = 1: the plain Trainer, no process group, exactly as before dp existed
        self._trainer: Trainer | None = None if dp > 1 else Trainer(*self._args, clock=time.time)
        self._dp_store: Any = None
        self._store: Any = None
        self._world = 0
        self._sender: WeightSender | None = None
        self.steps_trained = 0  # train_step calls that returned here: shows every rank took part

    @property
    def trainer(self) -> Trainer:
        assert self._trainer is not None, "a dp rank trains only after join_dp"
        return self._trainer

    def open_dp(self, timeout_s: float = SYNC_TIMEOUT_S) -> tuple[str, int]:
        """Rank 0: host the dp group's store on this node (the other ranks connect to (host, port))."""
        import ray

        host = ray.util.get_node_ip_address()
        self._dp_store = SyncGroup.host_store(host, self.dp, timeout_s)
        return host, int(self._dp_store.port)

    def join_dp(self, host: str, port: int, timeout_s: float = SYNC_TIMEOUT_S) -> None:
        """Join the dp group (blocks until every rank has) and build this rank's replica.

        DDP's construction broadcasts rank 0's weights, so all replicas start equal."""
        init_dp_group(self.rank, self.dp, host, port, store=self._dp_store, timeout_s=timeout_s)
        self._trainer = DataParallelTrainer(*self._args, clock=time.time)

    def describe(self) -> dict[str, Any]:
        """Where this rank runs and what it holds: the driver's proof that every rank trained in step."""

        digest = hashlib.sha256()
        for name, tensor in sorted(self.trainer.weights().items()):
            digest.update(name.encode())
            digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
        return {"rank": self.rank, "pid": os.getpid(), "node": self.node_id(),
                "version": self.trainer.version, "optimizer_steps": self.trainer.optimizer_steps(),
                "steps_trained": self.steps_trained, "weights_sha256": digest.hexdigest()}

    def open_sync(self, world_size: int, timeout_s: float = SYNC_TIMEOUT_S) -> tuple[str, int]:
        """Host a new sync group's store on a free port of this node; engines connect to (host, port).

        A new store per group: a rebuilt group (after a fault) must not meet the old one's keys."""
        import ray

        self._sender = None  # the old group, if any, is dropped
        host = ray.util.get_node_ip_address()
        self._store = SyncGroup.host_store(host, world_size, timeout_s)
        self._world = world_size
        return host, int(self._store.port)

    def join_sync(self, bucket_bytes: int = DEFAULT_BUCKET_BYTES, timeout_s: float = SYNC_TIMEOUT_S) -> None:
        group = SyncGroup("", 0, 0, self._world, timeout_s=timeout_s, store=self._store)
        self._sender = WeightSender(group, bucket_bytes)

    def train_step(self, batch: list[Rollout]) -> tuple[StepStats, tuple[tuple[str, float, float], ...]]:
        stats = self.trainer.train_step(batch)
        self.steps_trained += 1
        return stats, self.trainer.last_intervals

    def send_weights(self) -> tuple[int, float, float]:
        """Broadcast the current weights and version to every engine; (version, start, end)."""
        assert self._sender is not None, "join_sync first"
        t0 = time.time()
        self._sender.send(self.trainer.weights(), self.trainer.version)
        return self.trainer.version, t0, time.time()

    def weights(self) -> dict[str, torch.Tensor]:
        return {k: v.clone() for k, v in self.trainer.weights().items()}

    def save_checkpoint(self, path: str) -> None:
        self.trainer.save_checkpoint(path)

    def load_checkpoint(self, path: str) -> int:
        self.trainer.load_checkpoint(path)
        return self.trainer.version

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()


class EngineHandle:
    """The driver's view of one engine actor: routing reads the last status, submissions wait for its next step."""

    def __init__(self, name: str, actor: Any, status: EngineStatus, index: int = 0) -> None:
        self.name, self.actor, self.status = name, actor, status
        self.index = index  # its slot: a replacement goes on the same placement-group bundle
        self._outbox: list[Request] = []
        self.inflight: dict[int, Request] = {}  # routed here, not completed: what its death would lose

    def accepting(self, version: int) -> bool:
        return self.status.accepts == version

    def load(self) -> int:
        return self.status.load + len(self._outbox)

    def capacity(self) -> int:
        return self.status.capacity

    def idle(self) -> bool:
        return self.status.idle and not self._outbox

    def submit(self, requests: Sequence[Request]) -> None:
        self._outbox.extend(requests)
        self.inflight.update((r.sid, r) for r in requests)

    def completed(self, completions: Sequence[Completion]) -> None:
        for c in completions:
            self.inflight.pop(c.sid, None)

    def step(self) -> Any:
        """Start one iteration on the actor with what was routed since the last; returns its future."""
        requests, self._outbox = self._outbox, []
        return self.actor.step.remote(requests)


def _gather(futures: Sequence[Any]) -> list[Any]:
    """Each future's result, or its Ray error (a dead actor, a task that raised) in its place: one
    failed call must not hide the others' results."""
    import ray
    from ray.exceptions import RayActorError, RayTaskError

    out: list[Any] = []
    for future in futures:
        try:
            out.append(ray.get(future))
        except (RayActorError, RayTaskError) as exc:
            out.append(exc)
    return out


def _await_death(actor: Any, timeout_s: float = 30.0) -> None:
    """Return once a killed engine actor answers calls with RayActorError (or after `timeout_s`)."""
    deadline = time.time() + timeout_s
    while time.time() < deadline and not _dead(_gather([actor.status.remote()])[0]):
        time.sleep(0.05)


def _dead(result: Any) -> bool:
    from ray.exceptions import RayActorError

    return isinstance(result, RayActorError)


@dataclass
class _Joining:
    handle: EngineHandle
    ready: Any  # future of the new actor's first status: resolves once its constructor has run
    since: float  # when the engine it replaces was found dead


class _Committer:
    """Commits checkpoints off the driver's path, one at a time. The trainer saves in its own process
    (queued before its next step, so the file holds exactly this version, and the driver sends that
    step only once the file is written); the driver's part, records and commit record with four
    fsyncs (~40-80 ms a step on this machine), runs in this thread while the engines keep
    generating. A new checkpoint first waits for the previous one, and a failing run lets the one in
    progress land: a trainer that dies mid-step leaves the checkpoint before that step committed."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def submit(self, work: Callable[[], None]) -> None:
        self.wait()
        self._thread = threading.Thread(target=self._run, args=(work,), name="checkpoint-commit", daemon=True)
        self._thread.start()

    def _run(self, work: Callable[[], None]) -> None:
        try:
            work()
        except BaseException as exc:  # re-raised in the driver's thread by wait()
            self._error = exc

    def join(self) -> None:
        """Let the commit in progress land; its error, if any, stays for wait()."""
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
            self._thread = None

    def wait(self) -> None:
        self.join()
        if self._error is not None:
            error, self._error = self._error, None
            raise error


@dataclass
class SyncSettings:
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    timeout_s: float = SYNC_TIMEOUT_S


@dataclass
class RayLoop:
    """The driver: the shared controller over engine handles and the trainer actor (see the module docstring).

    `spawn(index, restart)` starts a replacement engine actor for slot `index`; without it a dead
    engine is not replaced and the run continues on the others.
    """

    control: Controller
    engines: list[EngineHandle]
    trainer: Any  # trainer rank 0: trains, sends the weights, writes the checkpoints
    out_dir: Path | None = None
    spawn: Callable[[int, int], Any] | None = None
    faults: Faults = field(default_factory=Faults)
    sync: SyncSettings = field(default_factory=SyncSettings)
    restarts: int = field(default=0, init=False)
    _joining: list[_Joining] = field(default_factory=list, init=False)
    # the sync group lost or gained a member: rebuild it before the next broadcast
    _regroup: bool = field(default=False, init=False)
    _fired: set[str] = field(default_factory=set, init=False)
    _committer: _Committer = field(default_factory=_Committer, init=False)
    _saving: Any = field(default=None, init=False)  # the trainer's checkpoint save in progress
    # data-parallel ranks 1..dp-1: they train every step with rank 0 (DDP) and do nothing else
    peers: list[Any] = field(default_factory=list)

    def actors(self) -> list[Any]:
        return [self.trainer, *self.peers, *(e.actor for e in self.engines), *(j.handle.actor for j in self._joining)]

    def run(self) -> list[StepStats]:
        try:
            self._loop()
            if self.control.final_checkpoint_due():
                self._checkpoint()
            self._committer.wait()
        finally:
            self._committer.join()  # a failing run still lands the commit in progress
        self.control.recorder.flush()
        return self.control.history

    def _loop(self) -> None:
        control = self.control
        if control.version > 0:  # resumed: the engines start from the initial model, the trainer does not
            self._sync()
        training: list[Any] | None = None  # the trainer ranks' futures while a step is in flight
        idle = 0
        while not control.done:
            if training is None:  # a new engine joins only between steps (the trainer sends its weights)
                self._admit_replacements(block=not self.engines or idle > 0)
            moved = control.route(self.engines)
            busy = [e for e in self.engines if not e.idle()]
            # a ready step starts before the engines' tick blocks: started only after it, the trainer
            # idled one engine iteration per step (measured: a 0.2 s prefill on each 1.1 s step)
            training, moved = self._start_step(training, busy, moved)
            moved = self._step_engines(busy) or moved
            training, moved = self._start_step(training, busy, moved)
            # with nothing left to generate, wait for the trainer rather than spin
            if training is not None and (not busy or self._step_done(training)):
                self._finish_step(training)
                training, moved = None, True
            idle = 0 if moved or busy else idle + 1
            if idle > control.config.max_idle_ticks:
                raise RuntimeError("ray loop stalled: no allowance, no engine work, no ready batch")

    def _start_step(self, training: list[Any] | None, busy: list[EngineHandle],
                    moved: bool) -> tuple[list[Any] | None, bool]:
        """Send the next batch to the trainer if one is ready and the last checkpoint is on disk."""
        control = self.control
        if training is None and control.ready() and self._saved(block=not busy):
            training = self._train(control.take())
            ranks = [self.trainer, *self.peers]
            self._fire("kill_trainer", self.faults.kill_trainer == control.version,
                       ranks[self.faults.kill_trainer_rank])
            return training, True
        return training, moved

    def _train(self, batch: list[Rollout]) -> list[Any]:
        """Start a step on every trainer rank; their futures, rank 0's first. Every rank gets the whole
        batch (runtime.parallel splits it): one object in Ray's store, read by all ranks."""
        import ray

        if not self.peers:
            return [self.trainer.train_step.remote(batch)]
        ref = ray.put(batch)
        return [rank.train_step.remote(ref) for rank in (self.trainer, *self.peers)]

    def _step_done(self, training: list[Any]) -> bool:
        """Every rank returned, or one failed: the others may then wait on it in a collective until the
        dp group's timeout, so a failure alone ends the step."""
        import ray

        ready, _ = ray.wait(training, num_returns=len(training), timeout=0)
        return len(ready) == len(training) or any(isinstance(r, Exception) for r in _gather(ready))

    def _step_result(self, training: list[Any]) -> tuple[StepStats, tuple[tuple[str, float, float], ...]]:
        """Rank 0's (stats, intervals); every rank's result checked first, in the order they finish, so a
        dead rank raises TrainerLost at once rather than after the survivors' collective times out."""
        import ray

        pending = list(training)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            self._trainer_get(ready[0])
        return self._trainer_get(training[0])  # the ranks' stats are global and equal: rank 0's stand

    def _step_engines(self, busy: list[EngineHandle]) -> bool:
        """One iteration on every busy engine at once; a dead one is replaced. True if anything moved."""
        control = self.control
        moved = False
        for engine, result in zip(busy, _gather([e.step() for e in busy]), strict=True):
            if _dead(result):
                self._engine_lost(engine)
                moved = True
                continue
            if isinstance(result, Exception):
                raise result
            completions, intervals, status = result
            engine.status = status
            engine.completed(completions)
            control.engine_intervals(engine.name, intervals)
            for c in completions:
                control.complete(c)
            moved = moved or bool(completions)
        return moved

    def _finish_step(self, training: list[Any]) -> None:
        """Collect the step, broadcast its weights to every engine (one collective), move the controller on."""
        stats, intervals = self._step_result(training)
        engine = self._engine_at(self.faults.kill_engine_in_sync, stats.step + 1)
        if engine is not None:
            self._fire("kill_engine_in_sync", True, engine.actor)
            # ray.kill only asks: a broadcast sent before the kill lands would complete, and the fault
            # would miss the sync it is meant to break (seen as a flaky test)
            _await_death(engine.actor)
        version, t0, t1 = self._sync()
        self.control.stepped(stats, intervals, (t0, t1), version)
        engine = self._engine_at(self.faults.kill_engine, version)
        if engine is not None:
            self._fire("kill_engine", True, engine.actor)
        if self.control.checkpoint_due(version):
            self._checkpoint()

    def _checkpoint(self) -> None:
        """Checkpoint the current version: the trainer's save is queued now, the commit follows in the background."""
        path = self.control.trainer_file()
        saved = self._saving = self.trainer.save_checkpoint.remote(str(path))
        commit = self.control.prepare_commit(path)

        def work() -> None:
            self._trainer_get(saved)
            commit()

        self._committer.submit(work)

    def _saved(self, block: bool) -> bool:
        """The trainer's last checkpoint file is written. The next step waits for it: a trainer that
        dies in a step must leave the checkpoint of the step before, so only that step is redone."""
        import ray

        if self._saving is not None and ray.wait([self._saving], timeout=None if block else 0)[0]:
            self._saving = None  # its outcome (a dead trainer) is the commit thread's to report
        return self._saving is None

    # -- weight sync, with the group rebuilt around faults ------------------------------------------
    def _sync(self) -> tuple[int, float, float]:
        """Broadcast the trainer's weights and version to every live engine; (version, start, end)."""
        for _ in range(SYNC_ATTEMPTS):
            self._admit_replacements(block=not self.engines and bool(self._joining), sync=False)
            if not self.engines:
                raise RuntimeError("every rollout engine is lost and none could be restarted")
            if self._regroup and not self._rebuild():
                continue
            result = self._broadcast()
            if result is not None:
                return result
        raise RuntimeError(f"weight sync failed {SYNC_ATTEMPTS} times in a row (see the engines' logs)")

    def _rebuild(self) -> bool:
        """A new sync group (new store, new port) of the trainer and the live engines; False if a rank failed."""
        world = len(self.engines) + 1
        bucket, timeout = self.sync.bucket_bytes, self.sync.timeout_s
        host, port = self._trainer_get(self.trainer.open_sync.remote(world, timeout))
        results = _gather(join_sync_group(self.trainer, [e.actor for e in self.engines], host, port, bucket, timeout))
        self._trainer_result(results[0])
        ok = not isinstance(results[0], Exception)
        for engine, result in zip(list(self.engines), results[1:], strict=True):
            if _dead(result):
                self._engine_lost(engine)
            ok = ok and not isinstance(result, Exception)
        self._regroup = not ok
        return ok

    def _broadcast(self) -> tuple[int, float, float] | None:
        """One collective; None if a rank failed (the group is then rebuilt and the broadcast redone)."""
        sent = self.trainer.send_weights.remote()
        results = _gather([e.actor.receive_weights.remote() for e in self.engines])
        span = self._trainer_result(_gather([sent])[0])
        ok = not isinstance(span, Exception)
        for engine, result in zip(list(self.engines), results, strict=True):
            if _dead(result):
                self._engine_lost(engine)
            elif not isinstance(result, Exception):
                engine.status = result
            ok = ok and not isinstance(result, Exception)
        if not ok:
            self._regroup = True
            return None
        return span

    # -- engine faults ---------------------------------------------------------------------------
    def _engine_lost(self, engine: EngineHandle) -> None:
        """Hand its samples back to the controller, start a replacement, rebuild the sync group."""
        self.engines.remove(engine)
        self.control.requeue(list(engine.inflight.values()))
        self._regroup = True
        if self.spawn is None:
            return
        self.restarts += 1
        if self.restarts > MAX_ENGINE_RESTARTS:
            raise RuntimeError(f"rollout engines died {self.restarts} times in this run; giving up")
        actor = self.spawn(engine.index, self.restarts)
        handle = EngineHandle(engine.name, actor, EngineStatus(None, 0, 0, True), engine.index)
        self._joining.append(_Joining(handle, actor.status.remote(), self.control.clock()))

    def _admit_replacements(self, block: bool, sync: bool = True) -> None:
        """New engines whose actors are up join the engines (and, with `sync`, get the weights now)."""
        import ray

        if not self._joining:
            return
        futures = [j.ready for j in self._joining]
        ready, _ = ray.wait(futures, num_returns=1 if block else len(futures), timeout=None if block else 0)
        admitted = False
        for joining in [j for j in self._joining if j.ready in ready]:
            self._joining.remove(joining)
            status = _gather([joining.ready])[0]
            if isinstance(status, Exception):  # the replacement died too: try another
                self.engines.append(joining.handle)  # (_engine_lost takes it out again)
                self._engine_lost(joining.handle)
                continue
            joining.handle.status = status
            self.engines.append(joining.handle)
            self._regroup = admitted = True
            self.control.recorder.interval(joining.handle.name, "rollout", "restart", joining.since,
                                           self.control.clock(), self.control.version, 0)
        if sync and admitted:
            self._sync()

    def _engine_at(self, fault: tuple[int, int] | None, version: int) -> EngineHandle | None:
        if fault is None or fault[1] != version:
            return None
        return next((e for e in self.engines if e.index == fault[0]), None)

    def _fire(self, name: str, due: bool, actor: Any) -> None:
        import ray

        if due and name not in self._fired:
            self._fired.add(name)
            ray.kill(actor, no_restart=True)

    # -- the trainer -----------------------------------------------------------------------------
    def _trainer_get(self, future: Any) -> Any:
        return self._trainer_result(_gather([future])[0], strict=True)

    def _trainer_result(self, result: Any, strict: bool = False) -> Any:
        """The result of a trainer call; TrainerLost if the trainer died (other errors raise with `strict`)."""
        if _dead(result):
            self._committer.join()  # name the checkpoint that is really there
            committed = self.control.committed
            where = (f"{self.out_dir} has a checkpoint at version {committed}: continue with "
                     f"`rlfleet run PLAN --resume {self.out_dir}`" if committed is not None and self.out_dir
                     else "no checkpoint was committed (run with --out to be able to resume)")
            raise TrainerLost(f"the trainer died during step {self.control.version}; {where}") from result
        if strict and isinstance(result, Exception):
            raise result
        return result


def init_ray(plan: Plan, address: str | None = None, extra_cpus: int = 1) -> None:
    """Join `address`, or start a local Ray on loopback whose node carries the plan's GPU-type resources.

    Loopback: Ray reads LOOPBACK_ENV when it is first imported (ray._private.ray_constants), so it is
    set here before the import; a process that imported ray earlier must set it itself (tests do, in
    conftest). Without it Ray picks this host's external address, unreachable on some machines.
    """
    if address is None:
        os.environ.setdefault(LOOPBACK_ENV, "0")
    import ray

    if ray.is_initialized():
        return
    if address is not None:
        ray.init(address=address, log_to_driver=False)
        return
    need: dict[str, float] = {}
    for group in plan.rollout:
        need[group.gpu_type] = need.get(group.gpu_type, 0) + group.gpus
    need[plan.trainer.gpu_type] = need.get(plan.trainer.gpu_type, 0) + plan.trainer.gpus
    # logical CPUs, one per bundle: the processes share the real cores, Ray only counts. address="local":
    # always a new instance; without it ray.init joins whatever cluster this machine last started
    ray.init(address="local", num_cpus=int(sum(need.values())) + extra_cpus, include_dashboard=False,
             log_to_driver=False, resources={TYPE_RESOURCE.format(t): float(n) for t, n in need.items()})


def toy_plan(engines: int, staleness: int, gpu_type: str = TOY_GPU_TYPE, dp: int = 1) -> Plan:
    return Plan(mode="async", staleness=staleness, rollout=(RolloutGroup(gpu_type=gpu_type, instances=engines),),
                trainer=TrainerGroup(gpu_type=gpu_type, dp=dp))


def check_dp(dp: int, prompts_per_step: int) -> None:
    """SpecError unless dp ranks can share a step's GRPO groups (one per prompt) equally (runtime.parallel)."""
    if dp < 1 or prompts_per_step % dp:
        raise SpecError(f"trainer dp={dp} cannot share a step's {prompts_per_step} GRPO groups equally; "
                        f"use a dp that divides {prompts_per_step}")


def engine_spawner(groups: Sequence[Group], model: PreTrainedModel | str, tokenizer: CharTokenizer, seed: int,
                   max_batch: int, interruptible: bool) -> Callable[[int, int], Any]:
    """`spawn(index, restart)`: an engine actor on slot `index` (its group's bundle), seeded per restart."""
    import ray

    engine_cls = ray.remote(EngineWorker)
    slots = [(g, i) for g in groups if g.role == "rollout" for i in range(g.actors)]

    def spawn(index: int, restart: int = 0) -> Any:
        group, i = slots[index]
        return engine_cls.options(**group.actor_options(i)).remote(
            model, tokenizer.eos_id, tokenizer.pad_id, f"engine{index}", max_batch,
            seed * 1000 + index + 1 + 100_003 * restart, interruptible)

    return spawn


def start_trainers(group: Group, model: PreTrainedModel | str, pad_id: int, train: TrainConfig, seed: int,
                   timeout_s: float = SYNC_TIMEOUT_S) -> list[Any]:
    """One trainer actor per bundle of the trainer group, rank r on bundle r; with dp > 1 they form the
    dp group, whose store rank 0 hosts. Rank 0's actor first."""
    import ray

    dp = group.actors
    cls = ray.remote(TrainerWorker)
    ranks = [cls.options(**group.actor_options(r)).remote(model, pad_id, train, seed, rank=r, dp=dp)
             for r in range(dp)]
    if dp > 1:
        host, port = ray.get(ranks[0].open_dp.remote(timeout_s))
        # every rank must be inside init_process_group at once: issue all joins, then wait
        ray.get([rank.join_dp.remote(host, port, timeout_s) for rank in ranks])
    return ranks


def join_sync_group(trainer: Any, engines: Sequence[Any], host: str, port: int, bucket_bytes: int,
                    timeout_s: float) -> list[Any]:
    """The joins of trainer rank 0 and `engines` to the sync group whose store the trainer opened at
    (host, port), as futures: every rank must be inside the group's constructor at once, so all the
    joins are issued before any is waited on."""
    world = len(engines) + 1
    return [trainer.join_sync.remote(bucket_bytes, timeout_s),
            *(a.join_sync.remote(host, port, r + 1, world, bucket_bytes, timeout_s) for r, a in enumerate(engines))]


def start_fleet(groups: Sequence[Group], model: PreTrainedModel | str, tokenizer: CharTokenizer,
                train: TrainConfig, seed: int, max_batch: int, interruptible: bool,
                bucket_bytes: int = DEFAULT_BUCKET_BYTES, timeout_s: float = SYNC_TIMEOUT_S,
                spawn: Callable[[int, int], Any] | None = None) -> tuple[list[EngineHandle], list[Any]]:
    """Engines and every trainer rank on their placement groups; the engines and trainer rank 0 (alone:
    the other ranks hold the same weights) joined in one sync group. (engine handles, trainer ranks).
    `spawn`: the engine_spawner of these arguments, where the caller keeps one to replace engines."""
    import ray

    spawn = spawn or engine_spawner(groups, model, tokenizer, seed, max_batch, interruptible)
    engines = sum(g.actors for g in groups if g.role == "rollout")
    actors = [spawn(k) for k in range(engines)]
    ranks = start_trainers(next(g for g in groups if g.role == "train"), model, tokenizer.pad_id, train, seed,
                           timeout_s)
    trainer = ranks[0]
    host, port = ray.get(trainer.open_sync.remote(len(actors) + 1, timeout_s))
    ray.get(join_sync_group(trainer, actors, host, port, bucket_bytes, timeout_s))
    statuses = ray.get([a.status.remote() for a in actors])
    handles = [EngineHandle(f"engine{k}", a, st, k) for k, (a, st) in enumerate(zip(actors, statuses, strict=True))]
    return handles, ranks


def start_actors(groups: Sequence[Group], model: PreTrainedModel | str, tokenizer: CharTokenizer,
                 train: TrainConfig, seed: int, max_batch: int, interruptible: bool,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES, timeout_s: float = SYNC_TIMEOUT_S
                 ) -> tuple[list[EngineHandle], Any]:
    """Engines and trainer rank 0 of a dp = 1 plan, joined in one sync group (start_fleet for any dp)."""
    handles, ranks = start_fleet(groups, model, tokenizer, train, seed, max_batch, interruptible, bucket_bytes,
                                 timeout_s)
    if len(ranks) != 1:
        raise ValueError(f"start_actors returns one trainer; this plan has {len(ranks)} ranks (use start_fleet)")
    return handles, ranks[0]


def run_toy_ray(steps: int, engines: int = 2, staleness: int = 2, seed: int = 0, out_dir: str | Path | None = None,
                prompts_per_step: int = 16, group_size: int = 16, train: TrainConfig | None = None,
                interruptible: bool = True, max_batch: int = 256, task: AdditionTask | None = None,
                hidden: int = 64, layers: int = 2, address: str | None = None,
                progress: Callable[[dict[str, Any]], None] | None = None, checkpoint_every: int = 0,
                resume: bool = False, identity: dict[str, Any] | None = None, faults: Faults | None = None,
                sync_timeout_s: float = SYNC_TIMEOUT_S, dp: int = 1) -> RunResult:
    """`runtime.loop.run_toy` with engines and trainer as Ray actors and real weight sync.

    Starts a local Ray on loopback (or joins `address`) and leaves it running for the caller to
    shut down (`ray.shutdown()`), so several runs share one start-up. Dead engines are replaced;
    a dead trainer raises `TrainerLost`, and `resume=True` continues the run in `out_dir` from its
    last checkpoint (`checkpoint_every` steps, and at the end).

    `dp` > 1: that many data-parallel trainer ranks (runtime.parallel), one actor each; rank 0 syncs the
    weights and checkpoints, every rank loads the checkpoint on resume, and a dead rank is a dead trainer.
    """
    import ray

    check_dp(dp, prompts_per_step)
    toy = toy_setup(steps, engines, staleness, seed, out_dir, prompts_per_step, group_size, train, task, hidden,
                    layers, resume, identity)
    out, task, tokenizer, ident, record, train, model, before = (
        toy.out, toy.task, toy.tokenizer, toy.identity, toy.record, toy.train, toy.model, toy.before)
    plan = toy_plan(engines, staleness, dp=dp)
    init_ray(plan, address)
    groups = place(plan, gpus=False)
    loop: RayLoop | None = None
    actors: list[Any] = []
    spawn = engine_spawner(groups, model, tokenizer, seed, max_batch, interruptible)
    try:
        handles, ranks = start_fleet(groups, model, tokenizer, train, seed, max_batch, interruptible,
                                     timeout_s=sync_timeout_s, spawn=spawn)
        trainer = ranks[0]
        actors = [h.actor for h in handles] + ranks
        control = Controller(task, tokenizer, LoopConfig(steps, prompts_per_step, group_size, staleness,
                                                         checkpoint_every),
                             seed=seed, out_dir=out, clock=time.time, progress=progress, identity=ident)
        if record is not None:
            assert out is not None
            # rank 0 wrote one file; every rank loads it, so the replicas continue equal
            ray.get([rank.load_checkpoint.remote(str(out / record["trainer"])) for rank in ranks])
            control.restore(record["controller"], RunRecorder.resume(out, record["records"]))
        loop = RayLoop(control, handles, trainer, out, spawn=spawn,
                       faults=faults or Faults(), sync=SyncSettings(timeout_s=sync_timeout_s), peers=ranks[1:])
        t0 = time.time()
        loop.run()
        seconds = time.time() - t0
        model.load_state_dict(ray.get(trainer.weights.remote()))
        described = tuple(ray.get([rank.describe.remote() for rank in ranks]))
        version, optimizer_steps = described[0]["version"], described[0]["optimizer_steps"]
    finally:
        for actor in (loop.actors() if loop is not None else []) + actors:
            ray.kill(actor)
        for g in groups:
            ray.util.remove_placement_group(g.placement_group)
    after = evaluate(model, task, tokenizer)
    result = summarize(control, before, after, task, seconds, out, version, optimizer_steps, loop.restarts)
    return dataclasses.replace(result, trainer_ranks=described)
