"""The per-sample controller of the token-level reference: the same rules as sim.controller
(the staleness rule from traces.staleness; routing one sample at a time to the engine whose next
decode iteration would be shortest), kept simple so the fast path has an independent check."""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Protocol

import numpy as np
import simpy

from sim.controller import ControllerBase
from sim.recorder import Recorder
from sim.reference.sample import Sample
from traces.staleness import allowance, batch_levels, batch_ready, shortfalls


class Worker(Protocol):
    """What the router needs to know of a rollout engine."""

    def accepting(self, version: int) -> bool: ...
    def load(self) -> int: ...
    def capacity(self) -> int: ...
    def iteration_seconds(self, batch: int) -> float: ...
    def assign(self, samples: list[Sample]) -> None: ...


class Controller(ControllerBase):
    def __init__(self, env: simpy.Environment, batch: int, eta: int, prompts: np.ndarray, responses: np.ndarray
                 ) -> None:
        super().__init__(env, batch, eta)
        self._prompts: list[int] = prompts.tolist()  # plain ints: indexing numpy per sample is slow
        self._responses: list[int] = responses.tolist()
        self.buffer: dict[int, list[Sample]] = {}  # start version -> completed samples, not yet trained
        self.buffered = 0
        self.engines: list[Worker] = []
        self.on_buffer: Callable[[], None] = lambda: None  # the trainer's wake-up
        # while the trainer waits for step `_watch_step`: start version L -> how many more samples of
        # versions <= L must be buffered before that step is ready (see `watch`)
        self._watch_step: int | None = None
        self._short: dict[int, int] = {}

    def allowance(self) -> int:
        return min(allowance(self.eta, self.version, self.batch, self.admitted), len(self._prompts) - self.admitted)

    def dispatch(self) -> None:
        """Admit what the capacity rule allows and route each sample to the least-loaded engine."""
        n = self.allowance()
        if n <= 0:
            return
        heap = [
            (e.iteration_seconds(e.load() + 1), i, e.load()) for i, e in enumerate(self.engines)
            if e.accepting(self.version) and e.load() < e.capacity()
        ]
        heapq.heapify(heap)
        given: dict[int, list[Sample]] = {}
        while n > 0 and heap:
            _, i, load = heap[0]
            sid = self.admitted
            given.setdefault(i, []).append(Sample(sid, self._prompts[sid], self._responses[sid], self.version))
            self.admitted += 1
            n -= 1
            e = self.engines[i]
            if load + 1 < e.capacity():  # heapreplace: pop then push in one sift, same order
                heapq.heapreplace(heap, (e.iteration_seconds(load + 2), i, load + 1))
            else:
                heapq.heappop(heap)
        for i, samples in given.items():
            self.in_flight[self.version] += len(samples)
            self.engines[i].assign(samples)
        if self._watch_step is not None:  # more samples in flight: the shortfalls change
            self.watch(self._watch_step)

    def completed(self, samples: list[Sample]) -> None:
        for s in samples:
            self.in_flight[s.start_version] -= 1
            self.buffer.setdefault(s.start_version, []).append(s)
        self.buffered += len(samples)
        if self._watch_step is None:
            self.on_buffer()
            return
        short = self._short
        for s in samples:
            for level in [lv for lv in short if lv >= s.start_version]:
                short[level] -= 1
                if short[level] == 0:
                    del short[level]
        if not short:
            self.on_buffer()

    def watch(self, step: int) -> None:
        """Wake the trainer (on_buffer) only once completions could make `step` ready.

        traces.staleness.shortfalls counts the completions still missing per start version.
        Each completion lowers them; the trainer wakes when none is left.
        The trainer still confirms with `ready`; admissions recompute this.
        """
        self._watch_step = step
        self._short = shortfalls(step, self.eta, self.batch, self.in_flight, self._counts())

    def unwatch(self) -> None:
        self._watch_step, self._short = None, {}

    def _counts(self) -> dict[int, int]:
        return {level: len(samples) for level, samples in self.buffer.items()}

    def ready(self, step: int) -> bool:
        """Step `step` may train the B oldest buffered samples without breaking the bound later."""
        return batch_ready(step, self.eta, self.batch, self.in_flight, self._counts())

    def take(self) -> list[Sample]:
        """The B oldest buffered samples, by start version then sample id."""
        batch: list[Sample] = []
        for level, n in batch_levels(self._counts(), self.batch).items():
            pool = sorted(self.buffer.pop(level), key=lambda s: s.sid)
            batch.extend(pool[:n])
            if pool[n:]:
                self.buffer[level] = pool[n:]
        self.buffered -= len(batch)
        return batch

    def train(self, step: int, rec: Recorder) -> tuple[int, int]:
        """Hand the next batch to step `step`: (samples, tokens); tally its trained tokens' staleness."""
        batch = self.take()
        for s in batch:
            for version, n in s.versions:
                rec.staleness_tokens[step - version] += n
        rec.trained.append(np.array([s.sid for s in batch], np.int64))
        return len(batch), sum(s.tokens for s in batch)

    def new_version(self, version: int) -> None:
        self.version = version
        self.request_dispatch()
