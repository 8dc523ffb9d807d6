"""The async loop on Ray: rollout engines and the trainer are actors, weights travel over gloo.

Processes:
- one `EngineWorker` actor per rollout engine and one `TrainerWorker` actor (trainer rank 0), placed
  with `runtime.placement.place` (one placement group per plan group, pinned to its GPU type);
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
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from runtime.controller import Controller, LoopConfig
from runtime.engine import Completion, Interval, Request, TorchEngine
from runtime.loop import RunResult, evaluate, summarize
from runtime.model import CharTokenizer, build_model, load_model, save_model, tiny_llama_config
from runtime.placement import TYPE_RESOURCE, Group, place
from runtime.sync import DEFAULT_BUCKET_BYTES, SyncGroup, WeightReceiver, WeightSender
from runtime.task import AdditionTask
from runtime.trainer import Rollout, StepStats, TrainConfig, Trainer
from traces import Plan, RolloutGroup, TrainerGroup

LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"  # "0": Ray takes 127.0.0.1 as the node address
TOY_GPU_TYPE = "CPU"  # the toy plan's type label; on CPU only a custom resource on the local node


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
                  bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> None:
        group = SyncGroup(host, port, rank, world_size)
        self._receiver = WeightReceiver(group, self.engine.model.state_dict(), bucket_bytes)

    def receive_weights(self) -> EngineStatus:
        """Take part in one weight broadcast; the weights apply at the engine's next iteration boundary."""
        assert self._receiver is not None, "join_sync first"
        state, version = self._receiver.receive()
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
    """The `Trainer` (rank 0) in its own process; rank 0 of the sync group, whose store it hosts."""

    def __init__(self, model: PreTrainedModel | str, pad_id: int, config: TrainConfig, seed: int,
                 threads: int = 1) -> None:
        torch.set_num_threads(threads)
        torch.manual_seed(seed)
        self.trainer = Trainer(_model(model), pad_id, config, seed=seed, clock=time.time)
        self._store: Any = None
        self._world = 0
        self._sender: WeightSender | None = None

    def open_sync(self, world_size: int) -> tuple[str, int]:
        """Host the sync group's store on a free port of this node; engines connect to (host, port)."""
        import ray

        host = ray.util.get_node_ip_address()
        self._store = SyncGroup.host_store(host, world_size)
        self._world = world_size
        return host, int(self._store.port)

    def join_sync(self, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> None:
        group = SyncGroup("", 0, 0, self._world, store=self._store)
        self._sender = WeightSender(group, bucket_bytes)

    def train_step(self, batch: list[Rollout]) -> tuple[StepStats, tuple[tuple[str, float, float], ...]]:
        stats = self.trainer.train_step(batch)
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

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()


class EngineHandle:
    """The driver's view of one engine actor: routing reads the last status, submissions wait for its next step."""

    def __init__(self, name: str, actor: Any, status: EngineStatus) -> None:
        self.name, self.actor, self.status = name, actor, status
        self._outbox: list[Request] = []

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

    def step(self) -> Any:
        """Start one iteration on the actor with what was routed since the last; returns its future."""
        requests, self._outbox = self._outbox, []
        return self.actor.step.remote(requests)


class RayLoop:
    """The driver: the shared controller over engine handles and the trainer actor (see the module docstring)."""

    def __init__(self, control: Controller, engines: list[EngineHandle], trainer: Any,
                 out_dir: Path | None = None) -> None:
        self.control, self.engines, self.trainer, self.out_dir = control, engines, trainer, out_dir

    def run(self) -> list[StepStats]:
        import ray

        control = self.control
        training: Any = None  # the trainer's future while a step is in flight
        idle = 0
        while not control.done:
            moved = control.route(self.engines)
            # start a ready step before blocking on the engines' tick: started after it, the trainer
            # idled one engine iteration per step (measured: a 0.2 s prefill on each 1.1 s step)
            if training is None and control.ready():
                training = self.trainer.train_step.remote(control.take())
                moved = True
            busy = [e for e in self.engines if not e.idle()]
            for engine, (completions, intervals, status) in zip(busy, ray.get([e.step() for e in busy]),
                                                                  strict=True):
                engine.status = status
                control.engine_intervals(engine.name, intervals)
                for c in completions:
                    control.complete(c)
                moved = moved or bool(completions)
            # with nothing left to generate, wait for the trainer rather than spin
            if training is not None and (not busy or ray.wait([training], timeout=0)[0]):
                self._finish_step(training)
                training, moved = None, True
            idle = 0 if moved or busy else idle + 1
            if idle > control.config.max_idle_ticks:
                raise RuntimeError("ray loop stalled: no allowance, no engine work, no ready batch")
        if self.out_dir is not None:
            ray.get(self.trainer.save_checkpoint.remote(str(self.out_dir / "checkpoint.pt")))
        control.recorder.flush()
        return control.history

    def _finish_step(self, training: Any) -> None:
        """Collect the step, broadcast its weights to every engine (one collective), move the controller on."""
        import ray

        stats, intervals = ray.get(training)
        sent = self.trainer.send_weights.remote()
        statuses = ray.get([e.actor.receive_weights.remote() for e in self.engines])
        version, t0, t1 = ray.get(sent)
        for engine, status in zip(self.engines, statuses, strict=True):
            engine.status = status
        self.control.stepped(stats, intervals, (t0, t1), version)
        if self.control.checkpoint_due(version):
            assert self.out_dir is not None
            ray.get(self.trainer.save_checkpoint.remote(str(self.out_dir / "checkpoint.pt")))
            self.control.recorder.flush()


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
    # logical CPUs, one per bundle: the processes share the real cores, Ray only counts
    ray.init(num_cpus=int(sum(need.values())) + extra_cpus, include_dashboard=False, log_to_driver=False,
             resources={TYPE_RESOURCE.format(t): float(n) for t, n in need.items()})


def toy_plan(engines: int, staleness: int, gpu_type: str = TOY_GPU_TYPE) -> Plan:
    return Plan(mode="async", staleness=staleness, rollout=(RolloutGroup(gpu_type=gpu_type, instances=engines),),
                trainer=TrainerGroup(gpu_type=gpu_type, dp=1))


def start_actors(groups: Sequence[Group], model: PreTrainedModel | str, tokenizer: CharTokenizer,
                 train: TrainConfig, seed: int, max_batch: int, interruptible: bool,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> tuple[list[EngineHandle], Any]:
    """Engines and trainer rank 0 on their placement groups, joined in one sync group."""
    import ray

    rollout = [g for g in groups if g.role == "rollout"]
    trainer_group = next(g for g in groups if g.role == "train")
    engine_cls, trainer_cls = ray.remote(EngineWorker), ray.remote(TrainerWorker)
    names = [f"engine{i}" for i in range(sum(g.actors for g in rollout))]
    slots = [(g, i) for g in rollout for i in range(g.actors)]
    actors = [engine_cls.options(**g.actor_options(i)).remote(
        model, tokenizer.eos_id, tokenizer.pad_id, name, max_batch, seed * 1000 + k + 1, interruptible)
        for k, (name, (g, i)) in enumerate(zip(names, slots, strict=True))]
    trainer = trainer_cls.options(**trainer_group.actor_options(0)).remote(model, tokenizer.pad_id, train, seed)
    world = len(actors) + 1
    host, port = ray.get(trainer.open_sync.remote(world))
    # every rank must be inside the group's constructor at once: issue all joins, then wait
    ray.get([trainer.join_sync.remote(bucket_bytes),
             *(a.join_sync.remote(host, port, r + 1, world, bucket_bytes) for r, a in enumerate(actors))])
    statuses = ray.get([a.status.remote() for a in actors])
    return [EngineHandle(n, a, s) for n, a, s in zip(names, actors, statuses, strict=True)], trainer


def run_toy_ray(steps: int, engines: int = 2, staleness: int = 2, seed: int = 0, out_dir: str | Path | None = None,
                prompts_per_step: int = 16, group_size: int = 16, train: TrainConfig | None = None,
                interruptible: bool = True, max_batch: int = 256, task: AdditionTask | None = None,
                hidden: int = 64, layers: int = 2, address: str | None = None,
                progress: Callable[[dict[str, Any]], None] | None = None) -> RunResult:
    """`runtime.loop.run_toy` with engines and trainer as Ray actors and real weight sync.

    Starts a local Ray on loopback (or joins `address`) and leaves it running for the caller to
    shut down (`ray.shutdown()`), so several runs share one start-up.
    """
    import ray

    out = Path(out_dir) if out_dir is not None else None
    task, tokenizer = task or AdditionTask(max_operand=4), CharTokenizer()
    train = train or TrainConfig(entropy_coef=0.01, decay_steps=steps)
    model = build_model(tiny_llama_config(tokenizer, hidden=hidden, layers=layers, intermediate=4 * hidden), seed=seed)
    if out is not None:
        save_model(model, tokenizer, out / "initial_model")
    before = evaluate(model, task, tokenizer)
    plan = toy_plan(engines, staleness)
    init_ray(plan, address)
    groups = place(plan, gpus=False)
    actors: list[Any] = []
    try:
        handles, trainer = start_actors(groups, model, tokenizer, train, seed, max_batch, interruptible)
        actors = [h.actor for h in handles] + [trainer]
        control = Controller(task, tokenizer, LoopConfig(steps, prompts_per_step, group_size, staleness), seed=seed,
                             out_dir=out, clock=time.time, progress=progress)
        history = RayLoop(control, handles, trainer, out).run()
        seconds = time.time() - control.recorder.origin
        model.load_state_dict(ray.get(trainer.weights.remote()))
    finally:
        for actor in actors:
            ray.kill(actor)
        for g in groups:
            ray.util.remove_placement_group(g.placement_group)
    after = evaluate(model, task, tokenizer)
    return summarize(history, before, after, task, seconds, out)
