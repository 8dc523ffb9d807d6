"""The reference rollout engine: continuous batching, one simulation event per decode iteration.

Samples are objects and every iteration is a simpy timeout, so it is slow and plainly right: the
fast path (sim.engine, sim.fleet) is checked against it. Between iterations it admits routed requests,
loads new weights (re-prefilling the KV cache), completes samples and preempts on KV overflow.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Generator
from typing import Any, Protocol

import simpy

from sim.recorder import Recorder
from sim.reference.controller import Controller
from sim.reference.sample import Sample
from sim.reference.tool_calls import ToolCalls
from traces.capacity import admits, kv_room


class DecodeCost(Protocol):
    """An engine kind's decode table (sim.decode_tables.DecodeTable, handed in by sim.simulate)."""

    def total(self, b: int, s0: float, k: int) -> float: ...


class PrefillCost(Protocol):
    """An engine kind's prefill curve (sim.decode_tables.PrefillCurve): seconds to prefill `tokens`."""

    def __call__(self, tokens: float) -> float: ...


class Engine:
    def __init__(
        self, env: simpy.Environment, name: str, group: str, decode: DecodeCost, prefill: PrefillCost,
        max_batch: int, kv_tokens: float, controller: Controller, recorder: Recorder,
        finish: Callable[[list[Sample]], None],
        *, mean_iteration_s: tuple[float, ...], interruptible: bool, tools: ToolCalls | None = None,
    ) -> None:
        self.env, self.name, self.group = env, name, group
        self.decode, self.prefill = decode, prefill
        self.max_batch, self.kv_tokens = max_batch, kv_tokens
        self.controller, self.rec, self.finish = controller, recorder, finish
        self.interruptible = interruptible
        self.mean_iteration_s = mean_iteration_s
        self.tools = tools  # agentic episodes: turns that end in a tool call go there, not to the trainer
        self.version = 0
        self.progress = 0  # decode iterations run so far
        self.context = 0.0  # total tokens held in the KV cache by running samples
        self.heap: list[tuple[int, int, Sample]] = []  # (progress at which it finishes, sid, sample)
        self.running: dict[int, Sample] = {}
        self.waiting: deque[Sample] = deque()  # preempted samples, first in line
        self.inbox: deque[Sample] = deque()  # routed here, not yet admitted
        self.version_log: list[tuple[int, int]] = [(0, 0)]  # (progress, version) from then on
        # progress at the last weight load: its KV re-prefill makes every sample running then count
        # as joined then, for the newest-first preemption order (their tokens are credited lazily)
        self.reloaded_at = 0
        self.update: tuple[int, float] | None = None  # (version, time the new weights are in)
        self._wake: simpy.Event | None = None  # idle: waiting for work
        controller.engines.append(self)
        self.proc = env.process(self.run())

    # ---- the router's view (sim.reference.controller.Worker) --------------------------------
    def accepting(self, version: int) -> bool:
        """New samples start under the current weights only: none while an update is pending."""
        return self.update is None and self.version == version

    def load(self) -> int:
        return len(self.running) + len(self.waiting) + len(self.inbox)

    def queued(self) -> int:
        """Samples waiting for admission (the queue plot)."""
        return len(self.waiting) + len(self.inbox)

    def assign(self, samples: list[Sample]) -> None:
        """The router sent requests: stop at the next iteration boundary and admit them."""
        self.inbox.extend(samples)
        self._interrupt()

    def request_update(self, version: int, ready_at: float) -> None:
        self.update = (version, ready_at)
        self._interrupt()

    def _interrupt(self) -> None:
        """Wake an idle engine; a decoding one looks at its inbox and updates after this iteration."""
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    # ---- the loop -------------------------------------------------------------------------
    def run(self) -> Generator[simpy.Event, Any, None]:
        while True:
            if self.update is not None and (self.interruptible or not self.running):
                yield from self._load_weights()
                continue  # an update may have arrived during the KV re-prefill: load it before decoding
            admitted = self._admit()
            if admitted:
                yield from self._prefill(admitted)
                continue  # an update may have arrived during prefill
            if not self.running:
                self._wake = self.env.event()
                yield self._wake
                self._wake = None
                continue
            yield from self._decode()

    def _admit(self) -> list[Sample]:
        # a non-interruptible engine drains before it loads new weights
        if self.update is not None or not (self.waiting or self.inbox):
            return []
        new: list[Sample] = []
        while self.waiting and self._fits(self.waiting[0], len(new)):
            new.append(self.waiting.popleft())
        while self.inbox and not self.waiting and len(self.running) + len(new) < self.max_batch:
            s = self.inbox.popleft()
            if self._fits(s, len(new)):
                new.append(s)
            else:
                self.waiting.append(s)
        for s in new:
            self.context += s.prompt + s.generated
            s.joined_at = self.progress
            self.running[s.sid] = s
            heapq.heappush(self.heap, (self.progress + s.response - s.generated, s.sid, s))
        return new

    def _fits(self, s: Sample, pending: int) -> bool:
        return admits(len(self.running), pending, self.max_batch, self.context, s.prompt + s.generated,
                      kv_room(self.kv_tokens))

    def _prefill(self, samples: list[Sample]) -> Generator[simpy.Event, Any, None]:
        tokens = sum(s.prompt + s.generated - s.cached for s in samples)  # a cached prefix is not prefilled
        start = self.env.now
        yield self.env.timeout(self.prefill(tokens))
        self.rec.count()
        self.rec.interval(self.name, self.group, "prefill", start, self.env.now, self.version, len(samples))

    def _decode(self) -> Generator[simpy.Event, Any, None]:
        """One iteration of the whole running batch; then completions and KV preemption."""
        b = len(self.running)
        start = self.env.now
        yield self.env.timeout(self.decode.total(b, self.context, 1))
        self.rec.count()
        self.rec.interval(self.name, self.group, "decode", start, self.env.now, self.version, b)
        self.progress += 1
        self.context += b
        self._complete()
        self._preempt()

    def _complete(self) -> None:
        done: list[Sample] = []
        heap, running, progress = self.heap, self.running, self.progress
        while heap and heap[0][0] <= progress:
            finish, sid, s = heapq.heappop(heap)
            if not self._current(finish, sid, s):
                continue  # stale heap entry of a preempted sample
            self._settle(s)
            del running[sid]
            self.context -= s.prompt + s.generated
            done.append(s)
        if done:
            ends = done if self.tools is None else self.tools.leave(self, done)
            if ends:
                self.finish(ends)
            self.controller.request_dispatch()

    def _current(self, finish: int, sid: int, s: Sample) -> bool:
        """A heap entry is the sample's current one, not one left by a residence it was preempted from
        (re-admitted later, it finishes later: the old entry must not complete it early)."""
        return self.running.get(sid) is s and finish == s.joined_at + s.response - s.generated

    def _settle(self, s: Sample) -> None:
        """Credit the tokens generated since it joined, split by the policy version that made them."""
        joined = s.joined_at
        end = min(self.progress, joined + (s.response - s.generated))
        from_progress, version = self.version_log[-1]
        if from_progress <= joined:  # the usual case: one version made them all
            s.add_tokens(version, end - joined)
            s.joined_at = end
            return
        # walk back from the newest version: only those loaded since it joined made its tokens, so
        # the cost does not grow with the number of steps run
        pieces: list[tuple[int, int]] = []
        until = end
        for from_progress, version in reversed(self.version_log):
            lo = max(joined, from_progress)
            if until > lo:
                pieces.append((version, until - lo))
            if from_progress <= joined:
                break
            until = min(end, from_progress)
        for version, n in reversed(pieces):
            s.add_tokens(version, n)
        s.joined_at = end

    def _preempt(self) -> None:
        """vLLM-style recompute preemption: while the KV cache overflows, the newest sample leaves."""
        while self.context > self.kv_tokens and len(self.running) > 1:
            sid = max(self.running, key=lambda i: (max(self.running[i].joined_at, self.reloaded_at), i))
            s = self.running.pop(sid)
            self._settle(s)
            self.context -= s.prompt + s.generated
            s.cached = 0  # its KV is recomputed whole, as any preempted sample's
            self.waiting.appendleft(s)

    def _load_weights(self) -> Generator[simpy.Event, Any, None]:
        assert self.update is not None
        request = self.update
        version, ready_at = request
        start = self.env.now
        if ready_at > start:
            yield self.env.timeout(ready_at - start)
        self.rec.interval(self.name, self.group, "weight_load", start, self.env.now, version, len(self.running))
        # no need to credit the running samples' tokens now: _settle splits them by version_log later
        if self.update == request:  # a newer request that came in meanwhile stays pending
            self.update = None
        self.version = version
        self.version_log.append((self.progress, version))
        self.reloaded_at = self.progress
        self.controller.request_dispatch()
        if self.running:  # the KV cache was computed by the old weights: recompute it
            start = self.env.now
            yield self.env.timeout(self.prefill(self.context))
            self.rec.interval(self.name, self.group, "reprefill", start, self.env.now, version, len(self.running))
        self.rec.count()
