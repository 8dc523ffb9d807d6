"""The per-sample controller of the token-level reference: the same rules as sim.controller (the
capacity ledger of traces.capacity, the routing policy of traces.routing), with one object per
sample and every completion delivered as it happens, so the fast path has an independent check."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from operator import attrgetter
from typing import Protocol

import numpy as np
import simpy

from sim.recorder import Recorder
from sim.reference.sample import Sample
from traces.capacity import CapacityLedger
from traces.routing import Router, deal


class Worker(Protocol):
    """What the router needs to know of a rollout engine."""

    mean_iteration_s: tuple[float, ...]  # [b]: one iteration of b mean-length samples (the routing key)
    max_batch: int

    def accepting(self, version: int) -> bool: ...
    def load(self) -> int: ...
    def assign(self, samples: list[Sample]) -> None: ...


class Controller:
    def __init__(self, env: simpy.Environment, batch: int, eta: float, prompts: np.ndarray, responses: np.ndarray,
                 chunk: int = 0, passes: np.ndarray | None = None, oversample: float = 1.0) -> None:
        self.env = env
        self._prompts: list[int] = prompts.tolist()  # plain ints: indexing numpy per sample is slow
        self._responses: list[int] = responses.tolist()
        self.ledger: CapacityLedger[list[Sample]] = CapacityLedger(batch, eta, len(self._prompts), chunk,
                                                                    oversample=oversample)
        # dynamic sampling: whether each sample's group passes the filter (None: all do)
        self._passes: list[bool] | None = None if passes is None else passes.tolist()
        self.engines: list[Worker] = []
        self.on_buffer: Callable[[], None] = lambda: None  # the trainer's wake-up
        self._router: Router | None = None  # made at the first routing, once every engine is known
        self._dispatch_pending = False
        # while the trainer waits for step `_watch_step`: start version L -> how many more samples of
        # versions <= L must be buffered before that step is ready (see `watch`)
        self._watch_step: int | None = None
        self._short: dict[int, int] = {}

    def request_dispatch(self) -> None:
        """Route at the end of this instant, once every engine whose state changes now has changed."""
        if not self._dispatch_pending and self.ledger.allowance() > 0:
            self._dispatch_pending = True
            self.env.timeout(0).callbacks.append(self._dispatch)

    def _dispatch(self, _event: simpy.Event) -> None:
        self._dispatch_pending = False
        self.dispatch()

    def dispatch(self) -> None:
        """Admit what the capacity rule allows and route each sample by the routing policy."""
        n = self.ledger.allowance()
        if n <= 0:
            return
        if self._router is None:
            self._router = Router([e.mean_iteration_s for e in self.engines], [e.max_batch for e in self.engines])
        version = self.ledger.version
        accepting = [e.accepting(version) for e in self.engines]
        loads = [e.load() if a else 0 for e, a in zip(self.engines, accepting, strict=True)]
        engine = self._router.route(n, accepting, loads)
        if not len(engine):
            return
        first = self.ledger.admit(len(engine))
        sids = np.arange(first, first + len(engine))
        for i, mine in deal(engine, sids):
            self.engines[i].assign([Sample(sid, self._prompts[sid], self._responses[sid], version)
                                    for sid in mine.tolist()])
        if self._watch_step is not None:  # more samples in flight: the shortfalls change
            self.watch(self._watch_step)

    def completed(self, samples: list[Sample]) -> None:
        """Samples completed now: into the buffer, and the trainer woken once its step could be ready."""
        for s in samples:
            if self._passes is None or (self._passes[s.sid] and self.ledger.accept(s.start_version, 1)):
                self.ledger.buffer(s.start_version, [s], 1)
            else:  # dynamic sampling dropped it (filtered, or surplus): the batch still lacks it
                self.ledger.drop(s.start_version, 1)
                self.request_dispatch()
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
        self._short = self.ledger.shortfalls(step)

    def unwatch(self) -> None:
        """The trainer stopped waiting: no more wake-ups."""
        self._watch_step, self._short = None, {}

    def ready(self, step: int) -> bool:
        """Step `step` may train its next chunk (the B oldest buffered samples unless streaming)
        without breaking the bound later."""
        return self.ledger.ready(step)

    def take(self) -> list[Sample]:
        """The next chunk (the B oldest buffered samples unless streaming), by start version then sample id."""
        pieces = self.ledger.take(lambda chunks: sorted(itertools.chain.from_iterable(chunks), key=attrgetter("sid")))
        return list(itertools.chain.from_iterable(pieces))

    def train(self, step: int, rec: Recorder) -> tuple[int, int]:
        """Hand the next batch to step `step`: (samples, tokens); tally its trained tokens' staleness."""
        batch = self.take()
        for s in batch:
            for version, n in s.versions:
                rec.staleness_tokens[step - version] += n
        rec.trained.append(np.array([s.sid for s in batch], np.int64))
        return len(batch), sum(s.tokens for s in batch)

    def new_version(self, version: int) -> None:
        """The trainer's weights are now `version`: new samples start under it."""
        self.ledger.version = version
        self.request_dispatch()
