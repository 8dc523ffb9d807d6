"""Admission under the staleness bound (AReaL's capacity rule), routing, and the trained-sample buffer.

With trainer version v, batch B and bound eta, at most (eta + v + 1) B samples may ever have been
admitted. Step s must train every sample started at a version <= s - eta (its oldest token would
otherwise exceed the bound), so before taking the B oldest buffered samples the trainer checks that
each later step can still do so (traces.staleness; the counts live in a traces.capacity ledger).
By induction over steps this is always reachable by waiting for completions: no sample is dropped,
none is trained twice, and no token is older than eta versions.

Admitted samples are routed by the routing policy of traces.routing (least iteration time with
one more request), over the fleet's arrays of loads (`FleetView`).

Samples are ids into `Samples` arrays. Engines file the completions their decode plans will make in
the completion pool; they reach the buffer when the controller next looks (`deliver`), and the
trainer is woken by one timer at the time its step becomes ready (`watch`), not by every completion.
With DAPO's dynamic sampling a completion may be dropped instead (traces.capacity), which frees
allowance mid-version: one more timer then delivers at each filed completion and routes again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np
import simpy

from sim.clock import Alarm, timeout_at
from sim.completion_pool import CompletionPool
from sim.decode_plans import FlatDecodePlans
from sim.recorder import Recorder
from sim.samples import Samples
from sim.tool_calls import ToolCalls, plan_entries
from traces.capacity import CapacityLedger
from traces.routing import Router


class FleetView(Protocol):
    """What the controller needs of the fleet (sim.fleet.Fleet): every engine's routing inputs, and sends."""

    def iteration_tables(self) -> tuple[Sequence[Sequence[float]], Sequence[int]]: ...
    def router_view(self, version: int) -> tuple[np.ndarray, np.ndarray]: ...
    def assign(self, engine: np.ndarray, sids: np.ndarray) -> None: ...


class Controller:
    def __init__(self, env: simpy.Environment, batch: int, eta: float, samples: Samples, chunk: int = 0,
                 passes: np.ndarray | None = None, oversample: float = 1.0, tools: ToolCalls | None = None) -> None:
        self.env = env
        self.samples = samples
        self.tools = tools  # agentic episodes: turns that end in a tool call are filed there
        self.ledger: CapacityLedger[np.ndarray] = CapacityLedger(batch, eta, len(samples), chunk,
                                                                 oversample=oversample)
        self.passes = passes  # dynamic sampling: [sid] whether its group passes the filter; None: all do
        # dynamic sampling: a dropped completion frees allowance mid-version, so look at the next filed
        # completion when it is due (the buffer is otherwise read lazily) and route again then
        self._drop_alarm = Alarm(env, lambda: self.pool.kth_time({}), self.deliver)
        self.pool = CompletionPool(samples.start_version)
        self.on_buffer: Callable[[], None] = lambda: None  # the trainer's wake-up
        self.fleet: FleetView | None = None  # set by the fleet once every engine has joined (Fleet.setup)
        self._router: Router | None = None  # made at the first routing, once every engine is known
        self._dispatch_pending = False
        # while the trainer waits for step `_watch_step`: start version L -> how many more samples of
        # versions <= L must be buffered before that step is ready (see `watch`)
        self._watch_step: int | None = None
        self._short: dict[int, int] = {}
        self._timer = 0  # generation of the trainer's wake-up timer: a newer one voids older ones
        self._retime_pending = False

    def allowance(self) -> int:
        """Samples the capacity rule lets in now."""
        return self.ledger.allowance()

    # ---- routing ------------------------------------------------------------------------------
    def request_dispatch(self) -> None:
        """Route at the end of this instant, once every engine whose state changes now has changed.

        Engines loading the same weights finish at the same time; routing at the first one's
        completion would hand it the whole batch. Nothing to route without allowance, and it only
        grows with a new version, which asks again.
        """
        if not self._dispatch_pending and self.allowance() > 0:
            self._dispatch_pending = True
            self.env.timeout(0).callbacks.append(self._dispatch)

    def _dispatch(self, _event: simpy.Event) -> None:
        self._dispatch_pending = False
        self.dispatch()

    def dispatch(self) -> None:
        """Admit what the capacity rule allows and route each sample by the routing policy."""
        n = self.allowance()
        if n <= 0:
            return
        assert self.fleet is not None, "Fleet.setup connects the fleet before the run starts"
        if self._router is None:
            self._router = Router(*self.fleet.iteration_tables())
        version = self.ledger.version
        engine = self._router.route(n, *self.fleet.router_view(version))
        if not len(engine):
            return
        first = self.ledger.admit(len(engine))
        sids = np.arange(first, first + len(engine))
        self.samples.start_version[sids] = version
        if self.samples.home is not None:  # an episode's turns all run where it was routed
            self.samples.home[sids] = engine
        self.fleet.assign(engine, sids)
        if self._watch_step is not None:  # more samples in flight: the shortfalls change
            self.watch(self._watch_step)

    # ---- filing completions ------------------------------------------------------------------
    def file(self, times: np.ndarray, sids: np.ndarray, version: int = 0) -> int:
        """An engine running weights `version` will complete `sids` (into the buffer) at `times`,
        unless it cuts its decode plan: the part id to cut."""
        if self.tools is not None:
            n = len(sids)
            return self._file_turns(times, sids, np.zeros(n, np.int64), np.arange(n), 1, np.full(n, version))
        part = self.pool.file(times, sids)
        self._retime_soon()
        return part

    def file_plans(self, plans: FlatDecodePlans, reward: np.ndarray, version: np.ndarray) -> int:
        """What n engines' decode plans complete (see CompletionPool.file_plans), engine e running
        weights version[e]: the first part's id."""
        if self.tools is not None:
            times, sids, owner, ranks = plan_entries(plans, reward)
            return self._file_turns(times, sids, owner, ranks, len(plans.n_done), np.asarray(version)[owner])
        first = self.pool.file_plans(plans, reward)
        self._retime_soon()
        return first

    def file_parts(self, times: np.ndarray, sids: np.ndarray, owner: np.ndarray, ranks: np.ndarray, n: int,
                   version: np.ndarray) -> int:
        """Completions of n engines filed together (see CompletionPool.file_parts), entry i by weights
        version[i]: the first part's id."""
        if self.tools is not None:
            return self._file_turns(times, sids, owner, ranks, n, version)
        first = self.pool.file_parts(times, sids, owner, ranks, n)
        self._retime_soon()
        return first

    def _file_turns(self, times: np.ndarray, sids: np.ndarray, owner: np.ndarray, ranks: np.ndarray, n: int,
                    version: np.ndarray) -> int:
        """Agentic: last turns into the pool, the others to the tool calls, as the same n parts."""
        assert self.tools is not None
        last = self.tools.last_turn(sids)
        more = ~last
        first = self.pool.file_parts(times[last], sids[last], owner[last], ranks[last], n)
        also = self.tools.file(times[more], sids[more], owner[more], ranks[more], n, version[more])
        assert also == first, "the tool calls number their parts as the pool does"
        self._retime_soon()
        return first

    def cut(self, part: int, keep: int) -> None:
        """Only the first `keep` completions filed as `part` happen."""
        self.pool.cut(part, keep)
        if self.tools is not None:
            self.tools.cut(part, keep)
        self._retime_soon()

    def cut_parts(self, parts: np.ndarray, keep: np.ndarray) -> None:
        """`cut` for many parts at once."""
        self.pool.cut_parts(parts, keep)
        if self.tools is not None:
            self.tools.cut_parts(parts, keep)
        self._retime_soon()

    def deliver(self) -> None:
        """Move the filed completions due by now into the buffer."""
        sids, levels, counts = self.pool.due(self.env.now)
        if not len(sids):
            return
        start = 0
        per_level = list(zip(levels.tolist(), counts.tolist(), strict=True))
        for level, n in per_level:
            self._resolve(level, sids[start:start + n], n)
            start += n
        short = self._short
        for level in list(short):
            short[level] -= sum(n for lv, n in per_level if lv <= level)
            if short[level] <= 0:
                del short[level]

    def _resolve(self, level: int, sids: np.ndarray, n: int) -> None:
        """Completions of start version `level` into the buffer, less those dynamic sampling drops."""
        if self.passes is None:
            self.ledger.buffer(level, sids, n)
            return
        passing = sids[self.passes[sids]]
        keep = self.ledger.accept(level, len(passing))
        if keep:
            self.ledger.buffer(level, passing[:keep], keep)
        if n - keep:
            self.ledger.drop(level, n - keep)
            self.request_dispatch()  # the batch still lacks what was dropped: more may be admitted

    # ---- the trainer's view -------------------------------------------------------------------
    def watch(self, step: int) -> None:
        """Wake the trainer (on_buffer) only once completions could make `step` ready.

        traces.staleness.shortfalls counts the completions still missing per start version.
        The filed completions say when they are met; one timer wakes the trainer then,
        reset whenever filings change.
        The trainer still confirms with `ready`; admissions recompute this.
        """
        self.deliver()
        self._watch_step = step
        self._short = self.ledger.shortfalls(step)
        self._retime()

    def unwatch(self) -> None:
        """The trainer stopped waiting: no more wake-ups."""
        self._watch_step, self._short = None, {}
        self._timer += 1

    def _retime_soon(self) -> None:
        """Filings changed: reset the trainer's timer at the end of this instant (once for many engines)."""
        if self.passes is not None:
            self._drop_alarm.soon()
        if self._watch_step is not None and not self._retime_pending:
            self._retime_pending = True
            self.env.timeout(0).callbacks.append(self._retime_now)

    def _retime_now(self, _event: simpy.Event) -> None:
        self._retime_pending = False
        if self._watch_step is not None:
            self.deliver()
            self._retime()

    def _retime(self) -> None:
        self._timer += 1
        if self._retime_pending:
            # `_retime_now` comes later this instant and voids a timer set now (a newer generation): it
            # sets the timer then, from the filings as they are by then (a busy fleet's dispatch watches
            # after every completion, and its engine's filing has asked for a retime already)
            return
        when = self.pool.kth_time(self._short)
        if when < float("inf"):
            generation = self._timer
            timeout_at(self.env, when).callbacks.append(lambda _ev: self._ring(generation))

    def _ring(self, generation: int) -> None:
        if generation != self._timer or self._watch_step is None:
            return
        self.deliver()
        if not self._short:
            self.on_buffer()
        if self._watch_step is not None and generation == self._timer:  # not ready yet: the next due time
            self._retime()

    def ready(self, step: int) -> bool:
        """Step `step` may train its next chunk (the B oldest buffered samples unless streaming)
        without breaking the bound later."""
        self.deliver()
        return self.ledger.ready(step)

    def take(self) -> np.ndarray:
        """The next chunk (the B oldest buffered samples unless streaming), by start version then sample id."""
        self.deliver()
        return np.concatenate(self.ledger.take(lambda chunks: np.sort(np.concatenate(chunks))))

    def train(self, step: int, rec: Recorder) -> tuple[int, int]:
        """Hand the next batch to step `step`: (samples, tokens); their staleness is tallied at the end."""
        batch = self.take()
        self.samples.trained_step[batch] = step
        rec.trained.append(batch)
        return len(batch), int(self.samples.exit_tokens[batch].sum())

    def new_version(self, version: int) -> None:
        """The trainer's weights are now `version`: new samples start under it."""
        self.ledger.version = version
        self.request_dispatch()
