"""The asynchronous RL loop, in one process: engines generate while the trainer trains on what is ready.

Scheduling: a deterministic round-robin. Each tick routes what the capacity rule allows, runs one
continuous-batching iteration on every engine, and lets the trainer take a step as soon as the
staleness-safe selection says one is ready; new weights (with their version) then go to every
engine. Generation and training interleave rather than overlap in wall time, but the logic is the
asynchronous one: engines run ahead of the trainer by up to eta versions, samples are trained up
to eta versions stale, and the decoupled loss corrects for it. Routing, selection and records live
in runtime.controller, shared with the Ray driver (runtime.ray_loop), where engines and trainer
are separate processes and do overlap. `run_in_process` runs a `RunSetup` (runtime.run_setup)
on this loop; runtime.toy builds the toy task's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from runtime.contracts import Task, Tokenizer
from runtime.controller import Controller, LoopConfig
from runtime.engine import RolloutEngine
from runtime.engine_spec import EngineSpec, engine_model
from runtime.records import RunRecorder
from runtime.run_result import Finished
from runtime.run_setup import RunSetup
from runtime.trainer import StepStats, Trainer


class AsyncLoop:
    """The controller driven in one process: a deterministic round-robin over engines and trainer."""

    def __init__(self, task: Task, tokenizer: Tokenizer, engines: list[RolloutEngine], trainer: Trainer,
                 config: LoopConfig, seed: int = 0, out_dir: Path | None = None,
                 clock: Callable[[], float] = time.perf_counter,
                 progress: Callable[[dict[str, Any]], None] | None = None,
                 identity: dict[str, Any] | None = None) -> None:
        self.engines, self.trainer, self.config = engines, trainer, config
        self.control = Controller(task, tokenizer, config, seed, out_dir, clock, progress, identity)
        self.clock = clock
        self.out_dir = out_dir

    @property
    def recorder(self) -> RunRecorder:
        return self.control.recorder

    def run(self) -> list[StepStats]:
        try:
            self._run()
        finally:
            self.control.close()  # tool calls still sleeping are woken and dropped
        if self.control.final_checkpoint_due():
            self.control.checkpoint(self.trainer.save_checkpoint)
        self.recorder.flush()
        return self.control.history

    def _run(self) -> None:
        control = self.control
        idle = 0
        while not control.done:
            moved = control.route(self.engines)
            for engine in self.engines:
                for c in engine.step():
                    control.complete(c)
                    moved = True
                control.engine_intervals(engine.name, engine.drain_intervals())
            if control.ready():
                self._train()
                moved = True
            engines_idle = all(e.idle() for e in self.engines)
            if not moved and engines_idle and control.tools_in_flight():
                control.wait_for_tools()  # only tool calls have work: sleep until one is back
                moved = True
            idle = 0 if moved or not engines_idle else idle + 1
            if idle > self.config.max_idle_ticks:
                raise RuntimeError("async loop stalled: no allowance, no engine work, no ready batch")

    def _train(self) -> None:
        stats = self.trainer.train_step(self.control.take())
        version = self.trainer.version
        t0 = self.clock()
        weights = self.trainer.weights()
        for engine in self.engines:
            engine.load_weights(weights, version)
        self.control.stepped(stats, self.trainer.last_intervals, (t0, self.clock()), version)
        if self.control.checkpoint_due(version):
            self.control.checkpoint(self.trainer.save_checkpoint)


def run_in_process(setup: RunSetup, config: LoopConfig, engines: int, seed: int = 0, max_batch: int = 256,
                   interruptible: bool = True, progress: Callable[[dict[str, Any]], None] | None = None,
                   engine: str = "torch") -> Finished:
    """`setup` trained by one trainer and `engines` rollout engines (`engine`: "torch" or "vllm",
    runtime.engine_spec) on `AsyncLoop`, seeded by `seed` without touching the caller's torch RNG; a
    resumed run's trainer and engines start from its checkpoint."""
    out, tokenizer, record = setup.out, setup.tokenizer, setup.record
    clock = time.time  # wall clock, not perf_counter: a resumed run's records continue another process's
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        trainer = Trainer(setup.model, tokenizer.pad_id, setup.train, seed=seed, clock=clock)
        if record is not None:
            assert out is not None
            trainer.load_checkpoint(out / record["trainer"])
        # torch engines copy the trainer's model (a resumed run's: the checkpoint's weights); vLLM engines
        # load the initial model's folder, then the checkpoint's weights before their first request
        weights = engine_model(engine, trainer.model, setup.model_dir or (out / "initial_model" if out else None))
        spec = EngineSpec(engine, weights, tokenizer.eos_id, tokenizer.pad_id, max_batch, interruptible)
        start = trainer.version if engine == "torch" else 0
        pool: list[RolloutEngine] = []
        try:
            for i in range(engines):
                pool.append(spec.build(f"engine{i}", seed * 1000 + i + 1, version=start, clock=clock))
                if start != trainer.version:
                    pool[-1].load_weights(trainer.weights(), trainer.version)
            loop = AsyncLoop(setup.task, tokenizer, pool, trainer, config, seed=seed, out_dir=out, clock=clock,
                             progress=progress, identity=setup.identity)
            if record is not None:
                assert out is not None
                loop.control.restore(record["controller"], RunRecorder.resume(out, record["records"]))
            t0 = clock()
            loop.run()
            seconds = clock() - t0
        finally:
            for e in pool:
                e.close()
    return Finished(loop.control, trainer.model, seconds, trainer.version, trainer.optimizer_steps())
