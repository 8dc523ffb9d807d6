"""The async loop's driver on Ray: rollout engines and the trainer are actors, weights travel over gloo.

Processes:
- one `EngineWorker` actor per rollout engine (runtime.engine_worker: a vLLM or torch engine, the
  run's `EngineSpec`; a vLLM engine's workers are its ranks in the sync group) and one `TrainerWorker` actor
  per trainer rank (runtime.trainer_worker), placed with `runtime.placement.place` (one placement
  group per plan group, pinned to its GPU type). With
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
`Faults` (runtime.settings) injects either for tests and drills: real `ray.kill`s at set points of
the loop (runtime.fault_injection). The engines, their replacements and the sync group's joins are
runtime.fleet's; start-up to tear-down of a whole run is runtime.ray_run's.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from runtime.committer import Committer
from runtime.controller import Controller
from runtime.fault_injection import FaultInjector
from runtime.fleet import EngineFleet, EngineHandle, Spawn, join_sync_group
from runtime.ray_futures import dead, gather
from runtime.settings import SYNC_ATTEMPTS, Faults, SyncSettings
from runtime.trainer import Rollout, StepStats


class TrainerLost(RuntimeError):
    """The trainer actor died; the run can continue from its last checkpoint with `--resume`."""


class RayLoop:
    """The driver: the shared controller over engine handles and the trainer actor (see the module docstring).

    `spawn(index, restart)` starts a replacement engine actor for slot `index`; without it a dead
    engine is not replaced and the run continues on the others. `peers`: data-parallel ranks
    1..dp-1, which train every step with rank 0 (DDP) and do nothing else.
    """

    def __init__(self, control: Controller, engines: list[EngineHandle], trainer: Any, out_dir: Path | None = None,
                 spawn: Spawn | None = None, faults: Faults | None = None, sync: SyncSettings | None = None,
                 peers: Sequence[Any] = ()) -> None:
        self.control = control
        self.trainer = trainer  # trainer rank 0: trains, sends the weights, writes the checkpoints
        self.peers = list(peers)
        self.out_dir = out_dir
        self.fleet = EngineFleet(engines, spawn, control.clock)
        self.faults = FaultInjector(faults or Faults())
        self.sync = sync or SyncSettings()
        self._committer = Committer()
        self._saving: Any = None  # the trainer's checkpoint save in progress

    @property
    def engines(self) -> list[EngineHandle]:
        return self.fleet.engines

    def actors(self) -> list[Any]:
        return [self.trainer, *self.peers, *self.fleet.actors()]

    def run(self) -> list[StepStats]:
        try:
            self._loop()
            if self.control.final_checkpoint_due():
                self._checkpoint()
            self._committer.wait()
        finally:
            self.control.close()  # tool calls still sleeping are woken and dropped
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
            if not moved and not busy and control.tools_in_flight():
                control.wait_for_tools()  # only tool calls have work: sleep until one is back
                moved = True
            idle = 0 if moved or busy else idle + 1
            if idle > control.config.max_idle_ticks:
                raise RuntimeError("ray loop stalled: no allowance, no engine work, no ready batch")

    def _start_step(self, training: list[Any] | None, busy: list[EngineHandle],
                    moved: bool) -> tuple[list[Any] | None, bool]:
        """Send the next batch to the trainer if one is ready and the last checkpoint is on disk."""
        control = self.control
        if training is None and control.ready() and self._saved(block=not busy):
            training = self._train(control.take())
            self.faults.trainer_step_started(control.version, [self.trainer, *self.peers])
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
        return len(ready) == len(training) or any(isinstance(r, Exception) for r in gather(ready))

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
        for engine, result in zip(busy, gather([e.step() for e in busy]), strict=True):
            if dead(result):
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
        self.faults.before_sync(stats.step + 1, self.engines)
        version, t0, t1 = self._sync()
        self.control.stepped(stats, intervals, (t0, t1), version)
        self.faults.synced(version, self.engines)
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
            self._admit_replacements(block=not self.engines and self.fleet.starting, sync=False)
            if not self.engines:
                raise RuntimeError("every rollout engine is lost and none could be restarted")
            if self.fleet.regroup and not self._rebuild():
                continue
            result = self._broadcast()
            if result is not None:
                return result
        raise RuntimeError(f"weight sync failed {SYNC_ATTEMPTS} times in a row (see the engines' logs)")

    def _rebuild(self) -> bool:
        """A new sync group (new store, new port) of the trainer and the live engines; False if a rank failed."""
        ranks = [e.ranks for e in self.engines]  # a vLLM engine's workers are one rank each
        bucket, timeout = self.sync.bucket_bytes, self.sync.timeout_s
        host, port = self._trainer_get(self.trainer.open_sync.remote(1 + sum(ranks), timeout))
        results = gather(join_sync_group(self.trainer, [e.actor for e in self.engines], host, port, bucket, timeout,
                                         ranks))
        self._trainer_result(results[0])
        ok = not isinstance(results[0], Exception)
        for engine, result in zip(list(self.engines), results[1:], strict=True):
            if dead(result):
                self._engine_lost(engine)
            ok = ok and not isinstance(result, Exception)
        self.fleet.regroup = not ok
        return ok

    def _broadcast(self) -> tuple[int, float, float] | None:
        """One collective; None if a rank failed (the group is then rebuilt and the broadcast redone)."""
        sent = self.trainer.send_weights.remote()
        results = gather([e.actor.receive_weights.remote() for e in self.engines])
        span = self._trainer_result(gather([sent])[0])
        ok = not isinstance(span, Exception)
        for engine, result in zip(list(self.engines), results, strict=True):
            if dead(result):
                self._engine_lost(engine)
            elif not isinstance(result, Exception):
                engine.status = result
            ok = ok and not isinstance(result, Exception)
        if not ok:
            self.fleet.regroup = True
            return None
        return span

    # -- engine faults ---------------------------------------------------------------------------
    def _engine_lost(self, engine: EngineHandle) -> None:
        """Hand its samples back to the controller; the fleet starts a replacement and marks the group for a rebuild."""
        self.control.requeue(self.fleet.lost(engine))

    def _admit_replacements(self, block: bool, sync: bool = True) -> None:
        """New engines whose actors are up join the engines (and, with `sync`, get the weights now)."""
        admitted = self.fleet.admit(block)
        for replacement in admitted:
            self.control.recorder.interval(replacement.handle.name, "rollout", "restart", replacement.since,
                                           self.control.clock(), self.control.version, 0)
        if sync and admitted:
            self._sync()

    # -- the trainer -----------------------------------------------------------------------------
    def _trainer_get(self, future: Any) -> Any:
        return self._trainer_result(gather([future])[0], strict=True)

    def _trainer_result(self, result: Any, strict: bool = False) -> Any:
        """The result of a trainer call; TrainerLost if the trainer died (other errors raise with `strict`)."""
        if dead(result):
            self._committer.join()  # name the checkpoint that is really there
            committed = self.control.committed
            where = (f"{self.out_dir} has a checkpoint at version {committed}: continue with "
                     f"`rlfleet run PLAN --resume {self.out_dir}`" if committed is not None and self.out_dir
                     else "no checkpoint was committed (run with --out to be able to resume)")
            raise TrainerLost(f"the trainer died during step {self.control.version}; {where}") from result
        if strict and isinstance(result, Exception):
            raise result
        return result
