"""The trainer: waits for a batch the staleness rule allows, trains, then pushes new weights.

Streaming (`chunks` > 1): a step's batch is taken and trained chunk by chunk as the rule allows
each (verl fully-async's local steps of `require_batches` x `ppo_mini_batch_size` samples), so
training starts on the first chunk while the rest is generated; the weights move once per step.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any, Protocol

import simpy

from sim.recorder import Recorder


class Buffer(Protocol):
    """The controller as the trainer sees it (sim.controller, or sim.reference.controller)."""

    on_buffer: Callable[[], None]

    def ready(self, step: int) -> bool: ...
    def watch(self, step: int) -> None: ...
    def unwatch(self) -> None: ...
    def train(self, step: int, rec: Recorder) -> tuple[int, int]: ...
    def new_version(self, version: int) -> None: ...


class Trainer:
    def __init__(
        self, env: simpy.Environment, controller: Buffer, recorder: Recorder, steps: int,
        step_seconds: Callable[[int], tuple[float, float]], sync_seconds: float,
        push_weights: Callable[[int, float], None], name: str = "trainer", switch_seconds: float = 0.0,
        chunks: int = 1, stop: Callable[[], bool] | None = None,
    ) -> None:
        self.env, self.ctl, self.rec = env, controller, recorder
        self.steps, self.step_seconds, self.sync_seconds = steps, step_seconds, sync_seconds
        self.push_weights, self.name = push_weights, name
        self.switch_seconds = switch_seconds  # colocated: engines hand the GPUs over and back
        self.chunks = chunks  # the step's batch is taken and trained in this many pieces
        self.stop = stop  # asked after each step (its sync included): True ends the run before `steps`
        self.stopped = False
        self.on_step: Callable[[], None] = lambda: None  # progress reporting
        self._wake: simpy.Event | None = None
        self._step = 0  # the step it waits to train
        controller.on_buffer = self._poke
        self.done = env.process(self.run())

    @property
    def waiting(self) -> bool:
        """Waiting for its batch (or the next chunk of it) to become ready."""
        return self._wake is not None

    def _poke(self) -> None:
        if self._wake is not None and not self._wake.triggered and self.ctl.ready(self._step):
            self._wake.succeed()

    def run(self) -> Generator[simpy.Event, Any, None]:
        for step in range(self.steps):
            self._step = step
            samples = tokens = 0
            for chunk in range(self.chunks):
                yield from self._wait_ready(step)
                got, got_tokens = self.ctl.train(step, self.rec)
                samples, tokens = samples + got, tokens + got_tokens
                logprob_s, train_s = self.step_seconds(got_tokens)
                if chunk == 0:
                    yield from self._switch(step, got)
                t0 = self.env.now
                yield self.env.timeout(logprob_s)
                self.rec.interval(self.name, "trainer", "logprob", t0, self.env.now, step, got)
                t1 = self.env.now
                yield self.env.timeout(train_s)
                self.rec.interval(self.name, "trainer", "train", t1, self.env.now, step, got)
            self.rec.step_ends.append(self.env.now)
            self.on_step()
            self.rec.step_samples.append(samples)
            self.rec.step_tokens.append(tokens)
            self.rec.count()
            yield from self._switch(step, samples)
            version = step + 1
            t2 = self.env.now
            ready_at = t2 + self.sync_seconds
            self.push_weights(version, ready_at)
            self.ctl.new_version(version)
            yield self.env.timeout(self.sync_seconds)
            self.rec.interval(self.name, "trainer", "sync", t2, self.env.now, version, samples)
            if self.stop is not None and self.stop():
                self.stopped = True
                return

    def _wait_ready(self, step: int) -> Generator[simpy.Event, Any, None]:
        while not self.ctl.ready(step):
            # the controller pokes once completions could have made the batch ready; and once
            # ready, more completions keep it so (see Controller.watch)
            self.ctl.watch(step)
            self._wake = self.env.event()
            yield self._wake
            self._wake = None
        self.ctl.unwatch()

    def _switch(self, step: int, samples: int) -> Generator[simpy.Event, Any, None]:
        if self.switch_seconds > 0:
            t = self.env.now
            yield self.env.timeout(self.switch_seconds)
            self.rec.interval(self.name, "trainer", "switch", t, self.env.now, step, samples)
