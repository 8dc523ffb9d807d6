"""The async loop's controller: what to admit, where to route it, what to train next, what to record.

It owns no engine and no trainer: the in-process loop (runtime.loop) and the Ray driver
(runtime.ray_loop) both drive it, so routing, batch selection and records are one code path
whatever runs the engines. It needs from an engine only the routing view below (a local
`TorchEngine` has it; the Ray driver's engine handle mirrors it from the actor's last status).

Routing is AReaL's: whole GRPO groups are admitted (a group's advantages need all its samples) while
the capacity rule (traces.staleness) allows, each sample to the accepting engine with the fewest
requests. A step trains the staleness-safe selection of the oldest completed groups.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from runtime.engine import Completion, Interval, Request
from runtime.model import CharTokenizer
from runtime.records import RunRecorder
from runtime.task import AdditionTask
from runtime.trainer import Rollout, StepStats
from traces.records import length_histogram
from traces.staleness import CapacityController


@dataclass(frozen=True)
class LoopConfig:
    steps: int
    prompts_per_step: int = 16  # GRPO groups per step; the capacity rule counts groups
    group_size: int = 16
    staleness: int = 2  # eta
    checkpoint_every: int = 0  # steps; 0 = only at the end (when out_dir is given)
    max_idle_ticks: int = 1000  # a tick where nothing can move is a bug; stop rather than spin


class Routable(Protocol):
    """What routing needs from an engine."""

    name: str

    def accepting(self, version: int) -> bool: ...
    def load(self) -> int: ...
    def capacity(self) -> int: ...
    def submit(self, requests: Sequence[Request]) -> None: ...


@dataclass
class _Group:
    uid: int
    start_version: int
    prompt: str
    done: list[Completion] = field(default_factory=list)


class Controller:
    def __init__(self, task: AdditionTask, tokenizer: CharTokenizer, config: LoopConfig, seed: int = 0,
                 out_dir: Path | None = None, clock: Callable[[], float] = time.perf_counter,
                 progress: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.task, self.tokenizer, self.config = task, tokenizer, config
        self.rng = random.Random(seed)
        self.ctl: CapacityController[list[Rollout]] = CapacityController(config.prompts_per_step, config.staleness)
        self.clock = clock
        self.progress = progress  # called with each step's metrics row, e.g. to print it
        self.out_dir = out_dir
        self.recorder = RunRecorder(out_dir, clock())
        self.groups: dict[int, _Group] = {}
        self.history: list[StepStats] = []
        self._last_step_end = self.recorder.origin
        self._lengths: dict[str, dict[str, int]] = {}

    @property
    def version(self) -> int:
        """The weights' version the controller has seen synced to the engines."""
        return self.ctl.version

    @property
    def done(self) -> bool:
        return self.ctl.version >= self.config.steps

    def route(self, engines: Sequence[Routable]) -> bool:
        """Admit whole groups while the capacity rule and the accepting engines' free slots allow."""
        n = self.config.group_size
        version = self.ctl.version
        open_engines = [e for e in engines if e.accepting(version)]
        loads = {e.name: e.load() for e in open_engines}
        routed = False
        while self.ctl.allowance() > 0 and sum(e.capacity() - loads[e.name] for e in open_engines) >= n:
            uid, start = self.ctl.admit()
            prompt = self.task.sample(self.rng)
            self.groups[uid] = _Group(uid, start, prompt)
            ids = tuple(self.tokenizer.encode(prompt))
            for j in range(n):
                target = min((e for e in open_engines if loads[e.name] < e.capacity()), key=lambda e: loads[e.name])
                target.submit([Request(uid * n + j, ids, self.task.max_new_tokens)])
                loads[target.name] += 1
            routed = True
        return routed

    def complete(self, c: Completion) -> None:
        """One sample finished; a group whose samples are all in becomes trainable (rewards computed here)."""
        group = self.groups[c.sid // self.config.group_size]
        group.done.append(c)
        if len(group.done) < self.config.group_size:
            return
        del self.groups[group.uid]
        rollouts = [
            Rollout(c.prompt, c.tokens, c.logprobs, c.versions,
                    self.task.reward(group.prompt, self.tokenizer.decode(c.tokens), c.finished), group.uid)
            for c in sorted(group.done, key=lambda c: c.sid)  # completion order varies; keep batches reproducible
        ]
        self.ctl.complete(group.uid, group.start_version, rollouts)

    def engine_intervals(self, name: str, intervals: Sequence[Interval]) -> None:
        for iv in intervals:
            self.recorder.interval(name, "rollout", iv.activity, iv.start, iv.end, iv.version, iv.samples)

    def ready(self) -> bool:
        """The next step may train now without breaking the staleness bound later."""
        return not self.done and self.ctl.ready(self.ctl.version)

    def take(self) -> list[Rollout]:
        batch = [r for unit in self.ctl.take() for r in unit.item]
        # the batch's length mix, recorded with its step: what a simulation of this run must assume
        self._lengths = {"prompt_lengths": length_histogram([len(r.prompt) for r in batch]),
                         "response_lengths": length_histogram([len(r.tokens) for r in batch])}
        return batch

    def stepped(self, stats: StepStats, train_intervals: Sequence[tuple[str, float, float]],
                sync_span: tuple[float, float], version: int) -> dict[str, Any]:
        """Record a trained and synced step; from now on routing admits at `version`. Returns the metrics row."""
        for activity, start, end in train_intervals:
            self.recorder.interval("trainer0", "trainer", activity, start, end, stats.step, stats.samples)
        self.recorder.interval("trainer0", "trainer", "sync", *sync_span, version, stats.samples)
        self.ctl.new_version(version)
        self.history.append(stats)
        now = self.clock()
        row: dict[str, Any] = {
            "step": stats.step, "samples": stats.samples, "tokens": stats.tokens,
            "mean_reward": round(stats.mean_reward, 6),
            "samples_per_s": round(stats.samples / max(now - self._last_step_end, 1e-9), 3),
            "max_staleness": stats.max_lag, "time": round(now - self.recorder.origin, 6),
            "loss": round(stats.loss, 6), "clip_fraction": round(stats.clip_fraction, 6),
            "dropped_fraction": round(stats.dropped_fraction, 6),
            "mean_behav_weight": round(stats.mean_behav_weight, 6), "grad_norm": round(stats.grad_norm, 6),
            "entropy": round(stats.entropy, 6),
            "staleness_tokens": dict(stats.lags),
            **self._lengths,
        }
        self.recorder.metric(row)
        if self.progress is not None:
            self.progress(row)
        self._last_step_end = now
        return row

    def checkpoint_due(self, version: int) -> bool:
        every = self.config.checkpoint_every
        return self.out_dir is not None and bool(every) and version % every == 0
