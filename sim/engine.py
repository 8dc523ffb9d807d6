"""A rollout engine under continuous batching, its decode laid out ahead in closed form.

Between events the running batch is fixed, so the engine does not step through its samples one by
one: it lays out every completion until it would next have a decision to take (its batch drains,
its KV cache would overflow, or, when new work could reach it, its next completion) as a decode
plan: the jumps between completions, each a closed-form sum of iteration times (sim.decode_plans).
It files the completions with the controller and sleeps until the decode plan ends. A weight
update or new requests interrupt it; it then finishes the iteration in progress and keeps only
what happened.

When nothing can reach it but an interrupt ("quiet": no staleness allowance left to route, no update
pending) it also decides its KV re-prefill and the prefill of what it admits, and sleeps through
them too. Engines that load new weights in the same instant lay out their decode plans together
(sim.fleet: one set of arrays), and decode plans interrupted in the same instant are cut together;
the fleet may park the engine meanwhile (sim.parking), and hands it back with a `Resume`. The
reference it is checked against is sim.reference (one event per decode iteration).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Generator
from typing import Any, Protocol

import numpy as np
import simpy

from sim.admission import Admission
from sim.clock import timeout_at
from sim.controller import Controller
from sim.decode_plans import EMPTY, Batch, DecodeCut, DecodePlan
from sim.decode_tables import DecodeTable, PrefillCurve
from sim.fleet_state import EngineTable, Resume
from sim.kernels.preemption import preempt
from sim.recorder import Recorder
from sim.segment import Segment, prepare


class FleetLink(Protocol):
    """What an engine asks of its fleet (sim.fleet.Fleet): the whole interface between the two."""

    table: EngineTable  # its version and pending update are its row here

    def add(self, engine: Engine) -> int: ...
    def ask(self, engine: Engine, reprefill: bool, event: simpy.Event | None = None) -> simpy.Event: ...
    def load(self, engine: Engine) -> simpy.Event: ...
    def lay_out(self, segments: list[Segment]) -> None: ...
    def note_interrupted(self, engine: Engine, plan: DecodePlan) -> None: ...
    def cut(self, engine: Engine, plan: DecodePlan) -> DecodeCut: ...
    def is_parked(self, i: int) -> bool: ...
    def held_load(self, i: int) -> int | None: ...
    def held_queued(self, i: int) -> int | None: ...
    def unpark(self, engine: Engine) -> None: ...


class Engine:
    """One rollout engine's process and state. What the fleet and the router use of it is public:
    its queues (`batch`, `waiting`, `inbox`, `progress`, `context`), `version` and `update` (its
    row of the fleet's engine table), and the methods marked for the fleet; it asks the fleet only
    what `FleetLink` names."""

    def __init__(
        self, env: simpy.Environment, name: str, group: str, decode: DecodeTable, prefill: PrefillCurve,
        max_batch: int, kv_tokens: float, controller: Controller, recorder: Recorder, fleet: FleetLink,
        reward_seconds: float, *, mean_iteration_s: tuple[float, ...], interruptible: bool,
    ) -> None:
        self.env, self.name, self.group = env, name, group
        self.decode, self.prefill = decode, prefill
        self.max_batch, self.kv_tokens = max_batch, kv_tokens
        self.controller, self.rec, self.fleet, self.reward_seconds = controller, recorder, fleet, reward_seconds
        self.samples = controller.samples
        self.interruptible = interruptible
        self.mean_iteration_s = mean_iteration_s  # [b]: one iteration of b mean-length samples (the routing key)
        self._table = fleet.table  # its version and update live in the fleet's engine table
        self.index = fleet.add(self)
        self.progress = 0  # decode iterations run so far
        self.context = 0.0  # total tokens held in the KV cache by running samples
        self.batch = Batch(EMPTY, EMPTY, EMPTY)
        self.waiting: deque[int] = deque()  # preempted samples, first in line
        self.inbox = EMPTY  # routed here, not yet admitted
        self._wake: simpy.Event | None = None  # idle: waiting for work
        self._plan: DecodePlan | None = None  # decoding: the decode plan in progress
        self._phases: Segment | None = None  # its prefills, while time has not passed them all
        self._interrupted = False  # an interrupt is on its way to the decode plan in progress
        self.proc = env.process(self.run())

    # ---- state kept in the fleet's engine table (so that it moves many engines at once) ---------
    @property
    def version(self) -> int:
        """The policy version of the weights it runs."""
        return int(self._table.version[self.index])

    @version.setter
    def version(self, version: int) -> None:
        self._table.version[self.index] = version

    @property
    def update(self) -> tuple[int, float] | None:
        """A pending weight update: (version, time the new weights are in), or None."""
        return self._table.update_of(self.index)

    @update.setter
    def update(self, request: tuple[int, float] | None) -> None:
        self._table.set_update(self.index, request)

    # ---- the router's view ----------------------------------------------------------------
    def accepting(self, version: int) -> bool:
        """New samples start under the current weights only: none while an update is pending."""
        return self.update is None and self.version == version

    def load(self) -> int:
        """Samples it holds: running (those whose jump has ended are gone), waiting and routed."""
        held = self.fleet.held_load(self.index)
        if held is not None:
            return held + len(self.waiting) + len(self.inbox)
        return self.own_load(self.env.now)

    def own_load(self, now: float) -> int:
        """`load` of an engine that holds its own state (not parked, not loading: the fleet checks)."""
        if self._phases is not None:
            self.catch_up()
        running = len(self.batch.sid)
        if self._plan is not None:  # samples whose jump has ended are gone already
            running -= self._plan.completed_before(self._plan.ended(now))
        return running + len(self.waiting) + len(self.inbox)

    def queued(self) -> int:
        """Samples waiting for admission (the queue plot)."""
        held = self.fleet.held_queued(self.index)
        if held is not None:
            return held + len(self.waiting) + len(self.inbox)
        self.catch_up()
        return len(self.waiting) + len(self.inbox)

    def assign(self, sids: np.ndarray) -> None:
        """The router sent requests: stop at the next iteration boundary and admit them."""
        self.inbox = np.concatenate((self.inbox, sids)) if len(self.inbox) else sids
        self._interrupt()

    def request_update(self, version: int, ready_at: float) -> None:
        """The trainer pushed `version`, in at `ready_at`."""
        self.update = (version, ready_at)
        self._interrupt()

    def _interrupt(self) -> None:
        if self.fleet.is_parked(self.index):  # it has something of its own to do: back to its process
            self.fleet.unpark(self)
            return
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()
        elif self._plan is not None and not self._interrupted and self.env.now < self._plan.ends[-1]:
            # a decode plan that ends this very instant is not cut short: the engine stops there anyway
            self.mark_interrupted()
            self.proc.interrupt()

    def mark_interrupted(self) -> None:
        """For the fleet too: an interrupt is on its way to the decode plan in progress; once
        decoding (not still in a prefill), the fleet works out its cut with the others of this instant."""
        assert self._plan is not None
        self._interrupted = True
        if self.env.now >= self._plan.t0:
            self.fleet.note_interrupted(self, self._plan)

    # ---- the loop -------------------------------------------------------------------------
    def run(self) -> Generator[simpy.Event, Any, None]:
        woken = False
        segment: Segment | Resume
        while True:
            if self._table.has_update(self.index) and (self.interruptible or not len(self.batch)):
                if self.update[1] > self.env.now:  # engines waiting for the same weights load together
                    segment = yield self.fleet.load(self)
                else:
                    self.load_weights(self.update, self.env.now)
                    decision = self.after_load()
                    segment = (yield decision) if isinstance(decision, simpy.Event) else decision
            elif woken and self.quiet():
                # routed to while idle, as many others are at once: lay out together at the end of
                # the instant (quiet: no more work can come this instant)
                segment = yield self.fleet.ask(self, False)
            else:
                segment = prepare(self, False)
            woken = False
            if isinstance(segment, Resume):  # it was parked with the fleet meanwhile
                woken = yield from self._resume(segment)
                continue
            if segment.plan is None and segment.request is not None:
                self.fleet.lay_out([segment])
            if not (yield from self._run(segment)):
                self._wake = self.env.event()
                yield self._wake
                self._wake, woken = None, True

    def _resume(self, resume: Resume) -> Generator[simpy.Event, Any, bool]:
        """Carry on as `_decode` would from the interrupt or the end of the decode plan the fleet
        handed back (Parking.unpark); True: it is idle, and woken now."""
        plan = self._plan
        if plan is None:
            return True
        self._plan = None
        if resume is Resume.INTERRUPT:
            self.catch_up()
            if self._phases is not None:
                yield from self._finish_prefills(plan)
            else:
                self._start_decoding(plan)
                yield from self._cut(plan)
            self._interrupted = False
            return False
        self._interrupted = False
        self.catch_up()
        self._start_decoding(plan)
        self._commit(plan, len(plan.k))
        self._preempt()
        return resume is Resume.END_WOKEN

    def restore_idle(self, progress: int, version: int, context: float) -> None:
        """For the fleet: take back its state from the fleet's arrays, idle (no decode plan)."""
        self.progress, self.version = progress, version
        self._plan = None
        self.batch = Batch(EMPTY, EMPTY, EMPTY)
        self.context = context

    def restore_decoding(self, progress: int, version: int, plan: DecodePlan, batch: Batch, context: float,
                         phases: Segment | None, inbox: np.ndarray) -> None:
        """For the fleet: take back its state from the fleet's arrays, its decode plan in progress,
        with its prefills (`phases`) recorded as far as time has passed them."""
        self.progress, self.version = progress, version
        self._plan = plan
        self._phases = phases
        self.batch, self.context, self.inbox = batch, context, inbox
        if phases is not None:
            self.catch_up()

    def quiet(self) -> bool:
        """Nothing but an interrupt can reach this engine: it may decide past its next decisions."""
        return not self._table.has_update(self.index) and self.controller.allowance() <= 0

    def _run(self, sg: Segment) -> Generator[simpy.Event, Any, bool]:
        """Carry out a segment; an update arriving during a prefill voids the rest. False: idle."""
        plan = sg.plan
        if plan is not None and (n := int(plan.done[0]) if len(plan.done) == 1 else int(plan.done.sum())):
            # a first jump's completions (busy small fleets) share one time: no repeat
            times = (np.array([float(plan.ends[0]) + self.reward_seconds] * n) if len(plan.done) == 1
                     else np.repeat(plan.ends, plan.done) + self.reward_seconds)
            plan.part = self.controller.file(times, plan.batch.sid[:n], self.version)
        if sg.quiet and sg.plan is not None:
            # its prefills need no events of their own: they happen inside the decode plan's one wait, and
            # are recorded as time passes them (`catch_up`)
            self._phases = sg
            yield from self._decode(sg.plan)
            return True
        if sg.reprefill_end is not None:
            yield timeout_at(self.env, sg.reprefill_end)
            self._reprefilled(sg)
            if not sg.quiet or self.update is not None:
                self._drop(sg.plan)
                return True
        if sg.joined is not None:
            self._admit(sg.admission, *sg.joined)
            yield timeout_at(self.env, sg.prefill_end)  # type: ignore[arg-type]
            self._prefilled(sg)
            if not sg.quiet or self.update is not None:
                self._drop(sg.plan)
                return True
        if sg.plan is None:
            return sg.reprefill_end is not None or sg.joined is not None
        yield from self._decode(sg.plan)
        return True

    def _reprefilled(self, sg: Segment) -> None:
        self.rec.interval(self.name, self.group, "reprefill", sg.start, sg.reprefill_end, self.version,  # type: ignore[arg-type]
                          len(self.batch))
        self.rec.count()

    def _prefilled(self, sg: Segment) -> None:
        start = sg.start if sg.reprefill_end is None else sg.reprefill_end
        self.rec.count()
        self.rec.interval(self.name, self.group, "prefill", start, sg.prefill_end, self.version,  # type: ignore[arg-type]
                          len(sg.admission.sids))

    def catch_up(self) -> None:
        """For the fleet too: the prefills of the decode plan in progress that time has reached have
        happened: the re-prefill ends, then what it admits joins (the queues change), then their prefill ends."""
        sg, now = self._phases, self.env.now
        if sg is None:
            return
        if sg.reprefill_end is not None:
            if now < sg.reprefill_end:
                return
            self._reprefilled(sg)
            sg.reprefill_end, sg.start = None, sg.reprefill_end
        if sg.joined is not None:
            self._admit(sg.admission, *sg.joined)
            sg.joined = None
        if sg.prefill_end is not None:
            if now < sg.prefill_end:
                return
            self._prefilled(sg)
            sg.prefill_end = None
        self._phases = None

    def _finish_prefills(self, plan: DecodePlan) -> Generator[simpy.Event, Any, None]:
        """An update came during a prefill: that prefill completes, the rest of the decode plan does not (the
        engine loads the new weights first, as the reference does)."""
        sg = self._phases
        assert sg is not None
        self._drop(plan)
        if sg.reprefill_end is not None:  # still re-prefilling: nothing is admitted before the load
            sg.joined, sg.prefill_end = None, None
            yield timeout_at(self.env, sg.reprefill_end)
        else:
            yield timeout_at(self.env, sg.prefill_end)  # type: ignore[arg-type]
        self.catch_up()

    def _admit(self, admission: Admission, batch: Batch, context: float) -> None:
        self.waiting = admission.waiting
        if len(self.inbox) > admission.seen:  # routed since it was decided: in line behind the rest
            self.inbox = np.concatenate((admission.inbox, self.inbox[admission.seen:]))
        else:
            self.inbox = admission.inbox
        self.batch, self.context = batch, context

    # ---- decoding -------------------------------------------------------------------------
    def _drop(self, plan: DecodePlan | None) -> None:
        if plan is not None and plan.part is not None:
            self.controller.cut(plan.part, 0)

    def _decode(self, plan: DecodePlan) -> Generator[simpy.Event, Any, None]:
        self._plan = plan
        if self._phases is None:
            self._start_decoding(plan)
        try:
            yield timeout_at(self.env, float(plan.ends[-1]))
        except simpy.Interrupt:  # finish the iteration in progress, then stop
            self._plan = None
            self.catch_up()
            if self._phases is not None:
                yield from self._finish_prefills(plan)
                return
            self._start_decoding(plan)
            yield from self._cut(plan)
            return
        finally:
            self._plan, self._interrupted = None, False
        self.catch_up()
        self._start_decoding(plan)
        self._commit(plan, len(plan.k))
        self._preempt()

    def _start_decoding(self, plan: DecodePlan) -> None:
        assert len(plan.batch) == len(self.batch)  # the same samples, sorted by the decode plan
        self.batch = plan.batch

    def _cut(self, plan: DecodePlan) -> Generator[simpy.Event, Any, None]:
        """Interrupted now: keep what happened, finish the iteration in progress (sim.decode_plans.cuts_of)."""
        cut = self.fleet.cut(self, plan)
        j, done, rest = cut.jumps, cut.iterations, cut.rest
        if plan.part is not None:
            self.controller.cut(plan.part, plan.completed_before(j))
        self._commit(plan, j)
        start = float(plan.ends[j - 1]) if j else plan.t0
        b, k = int(plan.b[j]), int(plan.k[j])
        if rest > 0:
            yield self.env.timeout(rest)
        self.rec.count()
        self.rec.interval(self.name, self.group, "decode", start, self.env.now, self.version, b)
        self.progress += done
        self.context += b * done
        finished = int(plan.done[j]) if done == k else 0
        if finished:  # it ends now, not when laid out: file the completions again, at now
            sids = self.batch.sid[:finished]
            self.context -= float(self.samples.exit_tokens[sids].sum())
            self.controller.file(np.full(finished, self.env.now + self.reward_seconds), sids, self.version)
            self._complete(finished, now=True)
        self._preempt()

    def _commit(self, plan: DecodePlan, j: int) -> None:
        """The first j jumps of the decode plan have happened: count them, record them, complete their samples."""
        if not j:
            return
        self.rec.count(j)
        self.rec.intervals(self.name, self.group, "decode", plan.starts[:j], plan.ends[:j], self.version, plan.b[:j])
        self.progress += int(plan.k_through[j - 1])
        self.context = float(plan.after[j - 1])
        n = plan.completed_before(j)
        if n:
            self._complete(n, now=bool(plan.ends[j - 1] == self.env.now))

    def _complete(self, n: int, now: bool) -> None:
        """The first n samples of the batch finished (their jump ending `now`, or earlier): credit
        their tokens and let them go. Their completions are filed with the controller already."""
        b = self.batch
        self.samples.credit(b.sid[:n], self.version, b.finish[:n] - b.joined[:n])
        self.batch = b.without(slice(n, None))
        if now:  # free slots: route more if the capacity rule allows (it does not while quiet)
            self.controller.request_dispatch()

    def _preempt(self) -> None:
        """vLLM-style recompute preemption: while the KV cache overflows, the newest sample leaves
        (sim.kernels.preemption). Most calls find no overflow: they return before any work."""
        if not (self.context > self.kv_tokens and len(self.batch) > 1):
            return
        s, b = self.samples, self.batch
        cached = s.cached if s.cached is not None else EMPTY  # its KV is recomputed whole, as any preempted sample's
        keep, sids, tokens, self.context = preempt(b.sid, b.joined, self.progress, self.context, self.kv_tokens,
                                                   s.prompt, s.generated, cached, s.cached is not None)
        self.batch = b.without(keep)
        s.credit(sids, self.version, tokens)  # one credit for all: staleness tallies are sums of integers
        self.waiting.extendleft(sids.tolist())  # each in front of the one before it, as appendleft one by one

    def load_weights(self, request: tuple[int, float], start: float) -> None:
        """For the fleet too: the weights of `request` are in (it was waited for since `start`)."""
        version = request[0]
        self.rec.interval(self.name, self.group, "weight_load", start, self.env.now, version, len(self.batch))
        if self.update == request:  # a newer request that came in meanwhile stays pending
            self.update = None
        # the running samples' tokens so far were made by the old weights (their KV is recomputed)
        b = self.batch
        tokens = self.progress - b.joined
        self.samples.credit(b.sid, self.version, tokens)
        self.samples.generated[b.sid] += tokens
        self.batch = Batch(b.sid, b.finish, np.full(len(b), self.progress, np.int64))
        self.version = version
        self.controller.request_dispatch()
        if not len(self.batch):
            self.rec.count()

    def after_load(self, event: simpy.Event | None = None) -> Segment | simpy.Event:
        """For the fleet too: what to do once loaded: a Segment now, or an event that brings one at the
        end of the instant.

        It re-prefills, then admits what this instant's routing brings; or, idle, it would sleep until
        the router wakes it: either way it decides after the routing, with the others that load now.
        """
        reprefill = len(self.batch) > 0
        if reprefill or not (self.waiting or len(self.inbox)):
            return self.fleet.ask(self, reprefill, event)
        segment = prepare(self, False)  # admits what it already holds at once, as the reference does
        if event is not None:
            event.succeed(segment)
        return segment
