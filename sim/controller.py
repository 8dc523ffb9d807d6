"""Admission under the staleness bound (AReaL's capacity rule), the router and the trained-sample buffer.

With trainer version v, batch B and bound eta, at most (eta + v + 1) B samples may ever have been
admitted. Step s must train every sample started at a version <= s - eta (its oldest token would
otherwise exceed the bound), so before taking the B oldest buffered samples the trainer checks that
each later step can still do so: for every start version L in (s - eta, s], the samples started at
<= L left untrained must fit the L + eta - s steps that remain for them. By induction over steps
this is always reachable by waiting for completions: no sample is dropped, none is trained twice,
and no token is older than eta versions.

Admitted samples are routed, one at a time, to the engine running the current weights whose decode
iteration would be shortest with one more request: a least-load router (as in AReaL and SGLang)
that knows a mixed fleet's speeds, so work water-fills from the fastest engines. Engines pulling
on their own would let the first few take the whole staleness allowance. Routing a batch is one
sort (`water_fill`), not a heap operation per sample.

Samples are ids into `Samples` arrays. Engines file the completions they plan in `pending`; they
reach the buffer when the controller next looks (`deliver`), and the trainer is woken by one timer
at the time its step becomes ready (`watch`), not by every completion.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable
from typing import Protocol

import numpy as np
import simpy

from sim.clock import timeout_at
from sim.kernels import route_few, water_fill_kernel
from sim.pending import Chunk, Pending
from sim.planning import FlatPlans
from sim.recorder import Recorder
from sim.samples import Samples
from traces.staleness import allowance, batch_levels, batch_ready, shortfalls


class Worker(Protocol):
    """What the router needs to know of a rollout engine."""

    mean_iteration_s: tuple[float, ...]

    def accepting(self, version: int) -> bool: ...
    def load(self) -> int: ...
    def capacity(self) -> int: ...
    def assign(self, sids: np.ndarray) -> None: ...


class Router(Protocol):
    """A fleet that answers for all its engines at once (sim.engine.Fleet)."""

    def router_view(self, version: int) -> tuple[np.ndarray, np.ndarray]: ...
    def assign(self, engine: np.ndarray, sids: np.ndarray) -> None: ...


def key_table(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What `water_fill` needs of a key table, worked out once per table: the distinct finite slot
    keys (sorted), each key's rank among them (len for inf), and below[r, v]: the slots of kind r
    whose key is <= values[v] (a searchsorted per row: keys rise with load)."""
    values = np.unique(keys[:, 1:])
    values = values[np.isfinite(values)]
    rank = np.searchsorted(values, keys)
    below = np.array([np.searchsorted(k[1:], values, "right") for k in keys]).reshape(len(keys), len(values))
    return values, rank, below


def water_fill(n: int, loads: np.ndarray, caps: np.ndarray, keys: np.ndarray, row: np.ndarray,
               table: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """Engine (index into loads) of each of n samples routed in turn to the smallest
    (keys[row[e], load + 1], e, load): keys[r, b] is an iteration with b running, shared by engines of a kind.

    Each engine's keys must not decrease with load: its candidate slots then come out of the
    one-at-a-time heap in sorted order, so the heap's first n picks are the n smallest candidates.
    A bisection on the key finds how many slots each engine gets; only those are sorted (compiled:
    sim.kernels.water_fill_kernel).
    `table` is key_table(keys), if the caller keeps it.
    """
    values, rank, below = table if table is not None else key_table(keys)
    return water_fill_kernel(n, np.asarray(loads, np.int64), np.asarray(caps, np.int64), np.asarray(row, np.int64),
                             len(values), rank, below)


FEW = 4  # up to this many free slots, sim.kernels.route_few; more, water_fill


class ControllerBase:
    """What both controllers (this one and the token-level reference's) share: the admission counts
    of the staleness rule, and routing deferred to the end of the current instant."""

    def __init__(self, env: simpy.Environment, batch: int, eta: int) -> None:
        self.env = env
        self._dispatch_pending = False
        self.batch = batch
        self.eta = eta
        self.version = 0
        self.admitted = 0
        self.in_flight: Counter[int] = Counter()  # start version -> samples admitted, not yet buffered

    def allowance(self) -> int:
        raise NotImplementedError

    def dispatch(self) -> None:
        raise NotImplementedError

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


class Controller(ControllerBase):
    def __init__(self, env: simpy.Environment, batch: int, eta: int, samples: Samples) -> None:
        super().__init__(env, batch, eta)
        self.samples = samples
        self._total = len(samples)
        self.buffer: dict[int, list[np.ndarray]] = {}  # start version -> completed sample ids, not yet trained
        self.buffered_by: Counter[int] = Counter()
        self.buffered = 0
        self.engines: list[Worker] = []
        self.pending = Pending(samples.start_version)
        self.on_buffer: Callable[[], None] = lambda: None  # the trainer's wake-up
        # while the trainer waits for step `_watch_step`: start version L -> how many more samples of
        # versions <= L must be buffered before that step is ready (see `watch`)
        self._watch_step: int | None = None
        self._short: dict[int, int] = {}
        self._timer = 0  # generation of the trainer's wake-up timer: a newer one voids older ones
        self._retime_pending = False
        self._keys: tuple[np.ndarray, np.ndarray] | None = None  # router: see _router_keys
        self._key_table: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # and water_fill's view of it
        self._rising: bool | None = None  # every key row rises with load (see water_fill)
        self._caps: np.ndarray | None = None
        self.fleet: Router | None = None  # routes through the fleet's arrays when set

    def allowance(self) -> int:
        return min(allowance(self.eta, self.version, self.batch, self.admitted), self._total - self.admitted)

    # ---- routing ------------------------------------------------------------------------------
    def dispatch(self) -> None:
        """Admit what the capacity rule allows and route each sample to the least-loaded engine."""
        n = self.allowance()
        if n <= 0:
            return
        if self._caps is None:
            self._caps = np.array([e.capacity() for e in self.engines], np.int64)
        if self.fleet is not None:  # every engine at once (sim.engine.Fleet)
            accepting, loads = self.fleet.router_view(self.version)
        else:
            accepting = np.array([e.accepting(self.version) for e in self.engines], bool)
            loads = np.array([e.load() if a else 0 for e, a in zip(self.engines, accepting, strict=True)], np.int64)
        keys, row_of = self._router_keys()
        if self._rising is None:
            self._rising = bool(np.all(np.diff(keys, axis=1) >= 0))
        routed = False
        if self._rising:  # a completion freed a slot or two: one argmin per sample (else not routed)
            engine, routed = route_few(n, accepting, loads, self._caps, keys, row_of, FEW)
        if not routed:
            idx = np.flatnonzero(accepting & (loads < self._caps))
            if not len(idx):
                return
            loads, caps = loads[idx], self._caps[idx]
            if self._rising:
                if self._key_table is None:
                    self._key_table = key_table(keys)
                engine = idx[water_fill(n, loads, caps, keys, row_of[idx], self._key_table)]
            else:  # a key that falls with load: route one at a time, as the definition says
                engine = self._route_one_by_one(n, idx, loads, caps, keys[row_of[idx]])
        if not len(engine):
            return
        n = len(engine)
        sids = np.arange(self.admitted, self.admitted + n)
        self.samples.start_version[sids] = self.version
        self.admitted += n
        self.in_flight[self.version] += n
        if self.fleet is not None:
            self.fleet.assign(engine, sids)
        else:
            order = np.argsort(engine, kind="stable")
            ranked, starts = np.unique(engine[order], return_index=True)
            groups = np.split(sids[order], starts[1:])
            # engines hear of their work in the order they got their first sample, as one at a time would
            for g in sorted(range(len(ranked)), key=lambda g: groups[g][0]):
                self.engines[int(ranked[g])].assign(groups[g])
        if self._watch_step is not None:  # more samples in flight: the shortfalls change
            self.watch(self._watch_step)

    def _router_keys(self) -> tuple[np.ndarray, np.ndarray]:
        """Distinct key rows (one per kind of engine) and each engine's row."""
        if self._keys is None:
            tables = [e.mean_iteration_s for e in self.engines]
            # engines of one group share one tuple: telling them apart by identity skips hashing
            # hundreds of long tuples (two equal tuples would make two equal rows: the same routing)
            distinct = list({id(t): t for t in tables}.values())
            width = max(len(t) for t in distinct)
            keys = np.full((len(distinct), width), np.inf)
            for r, t in enumerate(distinct):
                keys[r, :len(t)] = t
            where = {id(t): r for r, t in enumerate(distinct)}
            self._keys = (keys, np.array([where[id(t)] for t in tables]))
        return self._keys

    @staticmethod
    def _route_one_by_one(n: int, idx: np.ndarray, loads: np.ndarray, caps: np.ndarray, keys: np.ndarray
                          ) -> np.ndarray:
        heap = [(float(keys[r, loads[r] + 1]), int(idx[r]), int(loads[r]), r) for r in range(len(idx))]
        heapq.heapify(heap)
        out = []
        while len(out) < n and heap:
            _, i, load, r = heap[0]
            out.append(i)
            if load + 1 < caps[r]:
                heapq.heapreplace(heap, (float(keys[r, load + 2]), i, load + 1, r))
            else:
                heapq.heappop(heap)
        return np.array(out, dtype=np.int64)

    # ---- completions --------------------------------------------------------------------------
    def plan(self, times: np.ndarray, sids: np.ndarray) -> Chunk:
        """An engine will complete `sids` (into the buffer) at `times`, unless it cuts the plan."""
        chunk = self.pending.add(times, sids)
        self._retime_soon()
        return chunk

    def plan_flat(self, plans: FlatPlans, reward: np.ndarray) -> int:
        """What n engines planning together complete (see Pending.add_plans): the first part's id."""
        first = self.pending.add_plans(plans, reward)
        self._retime_soon()
        return first

    def plan_parts(self, times: np.ndarray, sids: np.ndarray, owner: np.ndarray, ranks: np.ndarray, n: int) -> int:
        """Completions of n engines planned together (see Pending.add_parts): the first part's id."""
        first = self.pending.add_parts(times, sids, owner, ranks, n)
        self._retime_soon()
        return first

    def cut(self, chunk: Chunk, keep: int) -> None:
        self.pending.cut(chunk, keep)
        self._retime_soon()

    def cut_parts(self, parts: np.ndarray, keep: np.ndarray) -> None:
        self.pending.cut_parts(parts, keep)
        self._retime_soon()

    def deliver(self) -> None:
        """Move the planned completions due by now into the buffer."""
        sids, levels, counts = self.pending.due(self.env.now)
        if not len(sids):
            return
        start = 0
        per_level = list(zip(levels.tolist(), counts.tolist(), strict=True))
        for level, n in per_level:
            self.in_flight[level] -= n
            self.buffered_by[level] += n
            self.buffer.setdefault(level, []).append(sids[start:start + n])
            start += n
        self.buffered += len(sids)
        short = self._short
        for level in list(short):
            short[level] -= sum(n for lv, n in per_level if lv <= level)
            if short[level] <= 0:
                del short[level]

    # ---- the trainer's view -------------------------------------------------------------------
    def watch(self, step: int) -> None:
        """Wake the trainer (on_buffer) only once completions could make `step` ready.

        traces.staleness.shortfalls counts the completions still missing per start version.
        The planned completions say when they are met; one timer wakes the trainer then,
        reset whenever plans change.
        The trainer still confirms with `ready`; admissions recompute this.
        """
        self.deliver()
        self._watch_step = step
        self._short = shortfalls(step, self.eta, self.batch, self.in_flight, self.buffered_by)
        self._retime()

    def unwatch(self) -> None:
        self._watch_step, self._short = None, {}
        self._timer += 1

    def _retime_soon(self) -> None:
        """Plans changed: reset the trainer's timer at the end of this instant (once for many engines)."""
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
        when = self.pending.kth_time(self._short)
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
        """Step `step` may train the B oldest buffered samples without breaking the bound later."""
        self.deliver()
        return batch_ready(step, self.eta, self.batch, self.in_flight, self.buffered_by)

    def take(self) -> np.ndarray:
        """The B oldest buffered samples, by start version then sample id."""
        self.deliver()
        batch: list[np.ndarray] = []
        for level, n in batch_levels(self.buffered_by, self.batch).items():
            pool = np.sort(np.concatenate(self.buffer.pop(level)))
            batch.append(pool[:n])
            if n < len(pool):
                self.buffer[level] = [pool[n:]]
            self.buffered_by[level] -= n
            if not self.buffered_by[level]:
                del self.buffered_by[level]
        out = np.concatenate(batch)
        self.buffered -= len(out)
        return out

    def train(self, step: int, rec: Recorder) -> tuple[int, int]:
        """Hand the next batch to step `step`: (samples, tokens); their staleness is tallied at the end."""
        batch = self.take()
        self.samples.trained_step[batch] = step
        rec.trained.append(batch)
        return len(batch), int(self.samples.exit_tokens[batch].sum())

    def new_version(self, version: int) -> None:
        self.version = version
        self.request_dispatch()
