"""The fleet: engines that decide in the same instant lay out their decode plans together.

Engines loading the same weights finish at the same time; each asks here (`ask`, `load`), and at
the end of the instant, once the router has sent this instant's work, all of them prepare and lay
out their decode plans at once (one set of numpy arrays). Those whose decode plan holds no
decision until the next push are parked (sim.parking): the push, the weight load and the next
decode plan then happen for all of them at once, without their processes. The fleet is also what
the controller routes through (`router_view`, `assign`: sim.controller.FleetView).
"""

from __future__ import annotations

import numpy as np
import simpy

from sim.clock import timeout_at
from sim.controller import Controller
from sim.decode_plans import Batch, DecodeCut, DecodePlan, cut_one, cuts_of, decode_plans_of, first_jump_plan
from sim.engine import Engine
from sim.engine_groups import Loading
from sim.fleet_state import LOADING, OWN, PARKED, EngineConstants, EngineTable
from sim.parking import Parking
from sim.recorder import Recorder
from sim.samples import Samples
from sim.segment import Segment, prepare, prepare_routed
from traces.capacity import fits_kv
from traces.routing import deal


class Fleet:
    """Every engine of a run, their engine table, and the instant's joint decisions."""

    def __init__(self, env: simpy.Environment, samples: Samples) -> None:
        self.env, self.samples, self.exit_tokens = env, samples, samples.exit_tokens
        self.engines: list[Engine] = []
        self.table = EngineTable()
        self.parking: Parking | None = None  # made once every engine has joined (setup)
        self._asking: list[tuple[Engine, bool, simpy.Event]] = []
        self._to_lay_out: list[Loading] = []  # loaded as arrays at this instant, to lay out at its end
        self._loading: dict[float, list[tuple[Engine, tuple[int, float], float, simpy.Event]]] = {}
        self._interrupted: list[tuple[Engine, DecodePlan]] = []  # interrupted, their cut still to work out
        self._cuts: dict[int, DecodeCut] = {}

    def add(self, engine: Engine) -> int:
        """A new engine joins: its index (its row in the engine table)."""
        self.engines.append(engine)
        return self.table.add()

    def setup(self, controller: Controller, rec: Recorder) -> None:
        """Once every engine has joined: their constants as arrays, and the controller routes here."""
        self.controller = controller
        controller.fleet = self
        consts = EngineConstants.of(self.engines)
        self.parking = Parking(self.env, self.samples, self.engines, self.table, consts, controller, rec)

    # ---- one instant's joint decisions ----------------------------------------------------------
    def ask(self, engine: Engine, reprefill: bool, event: simpy.Event | None = None) -> simpy.Event:
        """An event that carries the engine's Segment (or a Resume, if it is parked) once decided
        at the end of the instant (`event`, or a new one)."""
        self._decide_soon()
        event = event if event is not None else self.env.event()
        self._asking.append((engine, reprefill, event))
        return event

    def _decide_soon(self) -> None:
        if not self._asking and not self._to_lay_out:
            self.env.timeout(0).callbacks.append(self._decide_all)

    def load(self, engine: Engine) -> simpy.Event:
        """The engine waits for its pending weights; an event that brings its next Segment. Engines
        that would wake at the same instant load in one callback, not one simpy event each."""
        assert engine.update is not None
        start = self.env.now
        when = start + (engine.update[1] - start)  # where a timeout of the difference would end
        if when not in self._loading:
            self._loading[when] = []
            timeout_at(self.env, when).callbacks.append(lambda _ev: self._load_all(when))
        event = self.env.event()
        self._loading[when].append((engine, engine.update, start, event))
        return event

    def _load_all(self, when: float) -> None:
        for engine, request, start, event in self._loading.pop(when):
            engine.load_weights(request, start)
            engine.after_load(event)

    def _decide_all(self, _event: simpy.Event) -> None:
        asking, self._asking = self._asking, []
        groups, self._to_lay_out = self._to_lay_out, []
        assert self.parking is not None
        asking = self.parking.park_all(asking, groups)
        if not asking:
            return
        segments = self._prepare_all([(engine, reprefill) for engine, reprefill, _ in asking])
        self.lay_out(segments)
        for (_, _, event), segment in zip(asking, segments, strict=True):
            if segment.request is not None and segment.request.new is not None:  # see sim.segment.prepare_routed
                segment.joined = (segment.plan.batch, segment.joined[1])  # type: ignore[union-attr,index]
            event.succeed(segment)

    def _prepare_all(self, asking: list[tuple[Engine, bool]]) -> list[Segment]:
        """sim.segment.prepare for many engines; the usual case (quiet, nothing preempted waiting, routed
        requests that all fit) as one set of arrays, any other engine on its own."""
        out: list[Segment | None] = [None] * len(asking)
        common = []
        for i, (e, reprefill) in enumerate(asking):
            if e.quiet() and not e.waiting and len(e.inbox) > 0 and len(e.batch) < e.max_batch:
                common.append(i)
            else:
                out[i] = prepare(e, reprefill)
        if common:
            assert self.parking is not None
            engines = [asking[i][0] for i in common]
            heads = [e.inbox[:e.max_batch - len(e.batch)] for e in engines]
            sizes = np.array([len(h) for h in heads])
            which = np.repeat(np.arange(len(engines)), sizes)
            ids = np.concatenate(heads)
            prompt = self.samples.prompt[ids]
            context = np.array([e.context for e in engines])
            room = self.parking.consts.room[[e.index for e in engines]]
            fits = fits_kv(context[which], prompt, room[which])
            firsts = np.cumsum(sizes) - sizes
            fits[firsts[[not len(e.batch) for e in engines]]] = True  # an empty engine always takes one
            tokens = np.add.reduceat(prompt, firsts).tolist()
            cached = self.samples.cached  # episodes back from a tool call: their prefix is not prefilled again
            prefill = tokens if cached is None else (np.add.reduceat(prompt - cached[ids], firsts)).tolist()
            finish = np.array([e.progress for e in engines])[which] + self.samples.response[ids]
            misfit = np.bincount(which[~fits], minlength=len(engines)).tolist()
            bounds = np.append(firsts, len(ids)).tolist()
            for n, i in enumerate(common):
                e, reprefill = asking[i]
                if misfit[n]:  # one does not fit: it waits, first in line; the engine works that out
                    out[i] = prepare(e, reprefill)
                    continue
                lo, hi = bounds[n], bounds[n + 1]
                new = Batch(ids[lo:hi], finish[lo:hi], np.full(hi - lo, e.progress, np.int64))
                out[i] = prepare_routed(e, reprefill, new, tokens[n], prefill[n])
        return out  # type: ignore[return-value]

    def lay_out(self, segments: list[Segment]) -> None:
        """The decode plans the segments ask for, laid out together (one engine alone: its first jump)."""
        wanted = [sg for sg in segments if sg.request is not None]
        if len(wanted) == 1 and wanted[0].request.stop_at_completion and wanted[0].request.new is None:  # type: ignore[union-attr]
            wanted[0].plan = first_jump_plan(wanted[0].request, self.exit_tokens)  # type: ignore[arg-type]
        elif wanted:
            plans = decode_plans_of([sg.request for sg in wanted], self.exit_tokens)  # type: ignore[misc]
            for sg, plan in zip(wanted, plans, strict=True):
                sg.plan = plan

    def note_interrupted(self, engine: Engine, plan: DecodePlan) -> None:
        """The engine's decode plan is interrupted now; its cut is worked out with the others' (`cut`)."""
        self._interrupted.append((engine, plan))

    def cut(self, engine: Engine, plan: DecodePlan) -> DecodeCut:
        """Where the engine's interrupted decode plan stops; worked out for all interrupted in this instant."""
        if len(self._interrupted) == 1 and not self._cuts and self._interrupted[0][0] is engine:
            # a busy small fleet: one engine interrupted at a time (the router refilled its freed slot)
            (_, noted), self._interrupted = self._interrupted[0], []
            return cut_one(noted, engine.decode, self.env.now)
        if id(engine) not in self._cuts:
            now = self.env.now
            todo = [(e, p) for e, p in self._interrupted if id(e) not in self._cuts]
            self._interrupted = []
            cuts = cuts_of([(p, e.decode) for e, p in todo], now)
            self._cuts.update((id(e), c) for (e, _), c in zip(todo, cuts, strict=True))
        return self._cuts.pop(id(engine))

    # ---- weight pushes ----------------------------------------------------------------------------
    def push(self, version: int, ready_at: float) -> None:
        """The trainer pushes new weights: parked engines stop, and wait for them, as arrays; the
        others (and parked ones that must do something of their own first) hear it one by one."""
        assert self.parking is not None
        request = (version, ready_at)
        loading = self.parking.stop_all(request)
        n = len(self.engines)
        waits = self.table.where[:n] == LOADING  # they only note it: their weights are on the way
        self.table.update_version[:n][waits], self.table.update_ready[:n][waits] = version, ready_at
        for i in np.flatnonzero(~waits).tolist():
            self.engines[i].request_update(version, ready_at)
        if loading:
            # wait in the order the per-engine path would: after what the trainer does this instant
            self.env.timeout(0).callbacks.append(lambda _ev: self._wait_loads(loading, request))

    def _wait_loads(self, loading: list[Loading], request: tuple[int, float]) -> None:
        ready_at = request[1]
        for g in loading:
            when = g.start + (ready_at - g.start)  # where each engine's timeout of the difference would end
            parts = [(float(when[0]), g)] if (when == when[0]).all() else [
                (w, g.subset(when == w)) for w in np.unique(when).tolist()]
            for w, part in parts:
                timeout_at(self.env, w).callbacks.append(lambda _ev, part=part: self._loaded(part, request))

    def _loaded(self, g: Loading, request: tuple[int, float]) -> None:
        """Engines that waited as arrays have the weights: they decide at the end of the instant."""
        assert self.parking is not None
        self.parking.load_group(g, request)
        self._decide_soon()
        self._to_lay_out.append(g)

    # ---- the controller's view (sim.controller.FleetView) -------------------------------------------
    def iteration_tables(self) -> tuple[list[tuple[float, ...]], list[int]]:
        """Each engine's routing keys (one decode iteration of b mean-length samples) and capacity."""
        return [e.mean_iteration_s for e in self.engines], [e.max_batch for e in self.engines]

    def router_view(self, version: int) -> tuple[np.ndarray, np.ndarray]:
        """Every engine at once: accepting (weights `version`, no update pending), and its load."""
        n = len(self.engines)
        acc = (self.table.update_version[:n] < 0) & (self.table.version[:n] == version)
        loads, free = np.zeros(n, np.int64), acc
        if self._to_lay_out:  # engines in a group being laid out: the group's counts
            member = np.zeros(n, bool)
            for g in self._to_lay_out:
                loads[g.engines] = g.count + g.inbox_count
                member[g.engines] = True
            free = acc & ~member
        own = np.flatnonzero(free)
        if len(own):
            # the others in one pass of plain Python (a busy fleet routes at every completion): an engine
            # holding its own state skips Engine.load's check of where it is
            engines, now, where = self.engines, self.env.now, self.table.where[own].tolist()
            loads[own] = [engines[i].load() if w != OWN else engines[i].own_load(now)
                          for i, w in zip(own.tolist(), where, strict=True)]
        return acc, loads

    def same_weights(self, engine: np.ndarray, version: np.ndarray) -> np.ndarray:
        """Whether each engine still runs weights `version`, no update pending (sim.tool_calls.Homes)."""
        return (self.table.version[engine] == version) & (self.table.update_version[engine] < 0)

    def assign(self, engine: np.ndarray, sids: np.ndarray) -> None:
        """The router (or a tool call returning: sim.tool_calls) sends sids[i] to engine[i]: engines
        the fleet holds while they wait for, or just got, weights as arrays take theirs as arrays;
        the others hear of their work in the order they got their first sample."""
        if len(engine) == 1 and not self._to_lay_out and self.table.where[int(engine[0])] != LOADING:
            self.engines[int(engine[0])].assign(sids)  # the common case of a busy fleet: a freed slot refilled
            return
        member = np.full(len(self.engines), -1)
        slot = np.zeros(len(self.engines), np.int64)
        for gi, g in enumerate(self._to_lay_out):
            member[g.engines] = gi
            slot[g.engines] = np.arange(len(g.engines))
        where = member[engine]
        for gi, g in enumerate(self._to_lay_out):
            mine = where == gi
            if mine.any():
                g.route(slot[engine[mine]], sids[mine])
        own = where < 0
        # only an episode back from its tool call reaches an engine still waiting for its weights (the
        # router sends to none): its group holds its inbox
        waiting = own & (self.table.where[engine] == LOADING)
        for i in np.flatnonzero(waiting).tolist():
            g = self.table.home[engine[i]]
            g.route(self.table.slot[engine[i:i + 1]], sids[i:i + 1])
        own &= ~waiting
        if own.any():
            for i, mine in deal(engine[own], sids[own]):
                self.engines[i].assign(mine)

    # ---- what engines ask of the fleet while it holds them ------------------------------------------
    def is_parked(self, i: int) -> bool:
        """Engine i sleeps through its decode plan in the fleet's arrays."""
        return bool(self.table.where[i] == PARKED)

    def held_load(self, i: int) -> int | None:
        """Running and routed samples the fleet holds for engine i, or None: it holds its own."""
        where = self.table.where[i]
        if where == OWN:
            return None
        assert self.parking is not None
        return self.parking.parked_load(i) if where == PARKED else self.parking.loading_load(i)

    def held_queued(self, i: int) -> int | None:
        """Samples routed to engine i, held by the fleet, that its admission has not taken yet; or None."""
        where = self.table.where[i]
        if where == OWN:
            return None
        assert self.parking is not None
        return self.parking.parked_queued(i) if where == PARKED else self.parking.loading_queued(i)

    def unpark(self, engine: Engine) -> None:
        """Hand a parked engine back to its process: it has something of its own to do."""
        assert self.parking is not None
        self.parking.unpark(engine)

    def flush(self) -> None:
        """The run ends: record what parked engines have done by now."""
        assert self.parking is not None
        self.parking.flush()
