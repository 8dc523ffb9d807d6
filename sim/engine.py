"""A rollout engine under continuous batching, planned ahead in closed form.

Between events the running batch is fixed, so the engine does not step through its samples one by
one: it plans every completion until it would next have a decision to take (its batch drains, its
KV cache would overflow, or, when new work could reach it, its next completion) as numpy arrays:
the jumps between completions, each a closed-form sum of iteration times (sim.planning). It files
the planned completions with the controller and sleeps until the plan ends. A weight update or new
requests interrupt it; it then finishes the iteration in progress and keeps only what happened.

When nothing can reach it but an interrupt ("quiet": no staleness allowance left to route, no update
pending) it also plans its KV re-prefill and the prefill of what it admits, and sleeps through them
too. Engines that load new weights in the same instant plan together (`Fleet`: one set of arrays),
and plans interrupted in the same instant are cut together. The reference it is checked against
is sim.reference (one event per decode iteration).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

import numpy as np
import simpy

from sim.bulk import Loading, Parked
from sim.clock import timeout_at
from sim.controller import Controller
from sim.costs import DecodeTable, PrefillCurve, stack_of
from sim.kernels import admissible, admit_rows, phases_done, reload_rows, split_stopped, stop_parked, stop_rows
from sim.pending import Chunk
from sim.planning import Batch, Cut, Plan, Request, cut_many, plan_first_jump, plan_flat, plan_many
from sim.recorder import Recorder
from sim.samples import Samples

KV_WATERMARK = 0.01  # vLLM's block-manager watermark
OWN, PARKED, LOADING = 0, 1, 2  # where an engine's state lives (Fleet._where)
EMPTY = np.empty(0, np.int64)


@dataclass(slots=True)
class Admission:
    """What `_admission` would do now: samples joining, and the queues left behind."""

    sids: np.ndarray
    waiting: deque[int]
    inbox: np.ndarray
    fresh: bool = True  # none of them was preempted (all come from the inbox)


@dataclass(slots=True)
class Segment:
    """What an engine will do next, decided at one instant (see Engine._prepare)."""

    quiet: bool
    start: float
    reprefill_end: float | None  # KV re-prefill after loading weights, if any
    admission: Admission
    joined: tuple[Batch, float] | None  # batch and KV context once admitted, if any are
    prefill_end: float | None
    request: Request | None  # the decode plan to make, if any
    plan: Plan | None = None


@dataclass(slots=True)
class Resume:
    """What a parked engine's process finds when the fleet hands it back (see Fleet.unpark):
    "interrupt" (cut the plan now), "end" (the plan ended now) or "woken" (it had ended, or there
    was none: idle, and now woken)."""

    action: str


class Fleet:
    """Engines that would plan in the same instant plan together (one set of numpy arrays).

    Engines loading the same weights finish at the same time; each asks here, and at the end of
    the instant, once the router has sent this instant's work, all of them prepare and plan at once.
    Those whose plan needs no decision until the next push are parked (sim.bulk): the push, the
    weight load and the next plan then happen for all of them at once, without their processes.
    """

    def __init__(self, env: simpy.Environment, samples: Samples) -> None:
        self.env, self.samples, self.exit_tokens = env, samples, samples.exit_tokens
        self.engines: list[Engine] = []
        self._asking: list[tuple[Engine, bool, simpy.Event]] = []
        self._to_plan: list[Loading] = []  # loaded at this instant, to plan at its end
        self._loading: dict[float, list[tuple[Engine, tuple[int, float], float, simpy.Event]]] = {}
        self.interrupted: list[tuple[Engine, Plan]] = []  # interrupted plans whose cut is still to work out
        self._cuts: dict[int, Cut] = {}
        self.parked: list[Parked] = []
        self._names: list[str] = []
        self._groups: list[str] = []
        # per engine, the state the fleet moves as arrays (Engine's properties read and write it):
        # where it is (OWN: its process; PARKED, LOADING: in `_home[i]`, at `_slot[i]`), its pending
        # update (version, -1 for none, and when the weights are in), and its weights' version
        self._where = np.zeros(0, np.int8)
        self._home = np.empty(0, object)
        self._slot = np.zeros(0, np.int64)
        self._upd_v = np.zeros(0, np.int64)
        self._upd_t = np.zeros(0)
        self._ver = np.zeros(0, np.int64)

    def add(self, engine: Engine) -> int:
        i = len(self.engines)
        if i == len(self._where):  # room for twice as many
            n = max(64, 2 * i)
            self._where = np.concatenate((self._where, np.full(n - i, OWN, np.int8)))
            self._home = np.concatenate((self._home, np.full(n - i, None, object)))
            self._slot, self._ver = (np.concatenate((a, np.zeros(n - i, np.int64))) for a in (self._slot, self._ver))
            self._upd_v = np.concatenate((self._upd_v, np.full(n - i, -1, np.int64)))
            self._upd_t = np.concatenate((self._upd_t, np.zeros(n - i)))
        self.engines.append(engine)
        self._names.append(engine.name)
        self._groups.append(engine.group)
        return i

    def _place(self, idx: np.ndarray | list[int], where: int, home: Parked | Loading | None) -> None:
        """Engines idx (in this order: slots 0, 1, ...) now live in `home` (or their own process)."""
        self._where[idx] = where
        self._home[idx] = home
        self._slot[idx] = np.arange(len(idx))

    def ask(self, engine: Engine, reprefill: bool, event: simpy.Event | None = None) -> simpy.Event:
        """An event that carries the engine's Segment once planned (`event`, or a new one)."""
        self._plan_soon()
        event = event if event is not None else self.env.event()
        self._asking.append((engine, reprefill, event))
        return event

    def _plan_soon(self) -> None:
        if not self._asking and not self._to_plan:
            self.env.timeout(0).callbacks.append(self._plan_all)

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
            engine._load_weights(request, start)
            engine._after_load(event)

    def _plan_all(self, _event: simpy.Event) -> None:
        asking, self._asking = self._asking, []
        groups, self._to_plan = self._to_plan, []
        asking = self._park_all(asking, groups)
        if not asking:
            return
        segments = self._prepare_all([(engine, reprefill) for engine, reprefill, _ in asking])
        self.plan(segments)
        for (_, _, event), segment in zip(asking, segments, strict=True):
            if segment.request is not None and segment.request.new is not None:  # see _prepare_routed
                segment.joined = (segment.plan.batch, segment.joined[1])  # type: ignore[union-attr,index]
            event.succeed(segment)

    def _prepare_all(self, asking: list[tuple[Engine, bool]]) -> list[Segment]:
        """Engine._prepare for many engines; the usual case (quiet, nothing preempted waiting, routed
        requests that all fit) as one set of arrays, any other engine on its own."""
        out: list[Segment | None] = [None] * len(asking)
        common = []
        for i, (e, reprefill) in enumerate(asking):
            if e._quiet() and not e.waiting and len(e.inbox) > 0 and len(e.batch) < e.max_batch:
                common.append(i)
            else:
                out[i] = e._prepare(reprefill)
        if common:
            engines = [asking[i][0] for i in common]
            heads = [e.inbox[:e.max_batch - len(e.batch)] for e in engines]
            sizes = np.array([len(h) for h in heads])
            which = np.repeat(np.arange(len(engines)), sizes)
            ids = np.concatenate(heads)
            prompt = self.samples.prompt[ids]
            context = np.array([e.context for e in engines])
            room = np.array([e.kv_tokens * (1 - KV_WATERMARK) for e in engines])
            fits = context[which] + prompt + 1 <= room[which]
            firsts = np.cumsum(sizes) - sizes
            fits[firsts[[not len(e.batch) for e in engines]]] = True  # an empty engine always takes one
            tokens = np.add.reduceat(prompt, firsts).tolist()
            finish = np.array([e.progress for e in engines])[which] + self.samples.response[ids]
            misfit = np.bincount(which[~fits], minlength=len(engines)).tolist()
            bounds = np.append(firsts, len(ids)).tolist()
            for n, i in enumerate(common):
                e, reprefill = asking[i]
                if misfit[n]:  # one does not fit: it waits, first in line; the engine works that out
                    out[i] = e._prepare(reprefill)
                    continue
                lo, hi = bounds[n], bounds[n + 1]
                new = Batch(ids[lo:hi], finish[lo:hi], np.full(hi - lo, e.progress, np.int64))
                out[i] = e._prepare_routed(reprefill, new, tokens[n])
        return out  # type: ignore[return-value]

    def cut(self, engine: Engine, plan: Plan) -> Cut:
        """Where the engine's interrupted plan stops; worked out for all interrupted in this instant."""
        if id(engine) not in self._cuts:
            now = self.env.now
            todo = [(e, p) for e, p in self.interrupted if id(e) not in self._cuts]
            self.interrupted = []
            cuts = cut_many([(plan, e.decode) for e, plan in todo], now)
            self._cuts.update((id(e), c) for (e, _), c in zip(todo, cuts, strict=True))
        return self._cuts.pop(id(engine))

    def plan(self, segments: list[Segment]) -> None:
        wanted = [sg for sg in segments if sg.request is not None]
        if len(wanted) == 1 and wanted[0].request.stop_at_completion and wanted[0].request.new is None:  # type: ignore[union-attr]
            wanted[0].plan = plan_first_jump(wanted[0].request, self.exit_tokens)  # type: ignore[arg-type]
        elif wanted:
            plans = plan_many([sg.request for sg in wanted], self.exit_tokens)  # type: ignore[misc]
            for sg, plan in zip(wanted, plans, strict=True):
                sg.plan = plan

    # ---- parking: many engines through a step as arrays (sim.bulk) ---------------------------
    def _park_all(self, asking: list[tuple[Engine, bool, simpy.Event]], groups: list[Loading]
                  ) -> list[tuple[Engine, bool, simpy.Event]]:
        """Park the engines planning now whose plan holds no decision: quiet, nothing preempted
        waiting, every routed sample it admits fits. The others are returned, to plan one by one
        (those that loaded as arrays get their state back first)."""
        quiet = self.controller.allowance() <= 0
        rest: list[tuple[Engine, bool, simpy.Event]] = []
        own: list[int] = []
        own_reprefill: list[bool] = []
        for e, rp, event in asking:
            if quiet and e.update is None and not e.waiting:
                e._park, e._loading = event, None
                own.append(e.index)
                own_reprefill.append(rp)
            else:
                rest.append((e, rp, event))
        parts = [self._rows_of(own)] if own else []
        for i in own:  # their inbox is in the arrays now (those that plan alone get theirs back)
            self.engines[i].inbox = EMPTY
        idx_parts = [np.array(own, np.int64)]
        reprefill_parts = [np.array(own_reprefill, bool)]
        free_parts = [np.ones(len(own), bool)]  # no update pending, nothing preempted waiting
        offset = len(own)
        for g in groups:
            # they come back from the arrays (those that plan alone get their state back below).
            # Nothing was preempted waiting on them when they parked, and nothing can have joined
            # their queues since (their process slept; the router sends them work as arrays): an
            # update that came in meanwhile is all that can keep them from parking again
            self._place(g.engines, OWN, None)
            free_parts.append(self._upd_v[g.engines] < 0)
            idx_parts.append(g.engines)
            reprefill_parts.append(g.count > 0)
            in_owner, in_sid = g.inbox()
            parts.append((g.owner + offset, g.sid, g.fin, g.joined, g.progress, g.context, g.version,
                          in_owner + offset, in_sid))
            offset += len(g.engines)
        if not offset:
            return rest
        idx, reprefill, free = (np.concatenate(c) for c in (idx_parts, reprefill_parts, free_parts))
        owner, sid, fin, joined, progress, context, version, in_owner, in_sid = (
            np.concatenate(c) for c in zip(*parts, strict=True))
        ok, take = self._admissible(idx, owner, context, free if quiet else False, in_owner, in_sid)
        if not ok.all():  # those engines plan one by one, from their own state
            for i in np.flatnonzero(~ok).tolist():
                e = self.engines[idx[i]]
                e.progress, e.context = int(progress[i]), float(context[i])
                rows = owner == i
                e.batch = Batch(sid[rows], fin[rows], joined[rows])
                e.inbox = in_sid[in_owner == i]
                rest.append((e, bool(reprefill[i]), e._park))  # type: ignore[arg-type]
                e._park = None
            keep, keep_in = ok[owner], ok[in_owner]
            renumber = np.cumsum(ok) - 1
            owner, sid, fin, joined = renumber[owner[keep]], sid[keep], fin[keep], joined[keep]
            in_owner, in_sid, take = renumber[in_owner[keep_in]], in_sid[keep_in], take[keep_in]
            progress, context, version = progress[ok], context[ok], version[ok]
            reprefill, idx = reprefill[ok], idx[ok]
        if len(idx):
            self._park(idx, owner, sid, fin, joined, progress, context, version, reprefill, in_owner, in_sid, take)
        return rest

    def _rows_of(self, idx: list[int]) -> tuple[np.ndarray, ...]:
        """The state of engines planning on their own, as the arrays a Loading holds."""
        engines = [self.engines[i] for i in idx]
        owner = np.repeat(np.arange(len(engines)), [len(e.batch) for e in engines])
        cat = [np.concatenate([getattr(e.batch, f) for e in engines]) for f in ("sid", "finish", "joined")]
        in_owner = np.repeat(np.arange(len(engines)), [len(e.inbox) for e in engines])
        return (owner, *cat, np.array([e.progress for e in engines], np.int64),
                np.array([e.context for e in engines], np.float64), np.array([e.version for e in engines], np.int64),
                in_owner, np.concatenate([e.inbox for e in engines]).astype(np.int64))

    def _admissible(self, idx: np.ndarray, owner: np.ndarray, context: np.ndarray, free: np.ndarray | bool,
                    in_owner: np.ndarray, in_sid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Engines that admit the head of their inbox whole (vLLM would admit each of them), and
        which inbox entries are those heads. `free`: quiet, and per engine nothing pending (False:
        not quiet, none is)."""
        if free is False:
            return np.zeros(len(idx), bool), np.zeros(len(in_sid), bool)
        return admissible(np.asarray(free, bool), owner, context, in_owner, in_sid, self._max_batch[idx],
                          self._room[idx], self.samples.prompt)

    def _park(self, idx: np.ndarray, owner: np.ndarray, sid: np.ndarray, fin: np.ndarray, joined: np.ndarray,
              progress: np.ndarray, context: np.ndarray, version: np.ndarray, reprefill: np.ndarray,
              in_owner: np.ndarray, in_sid: np.ndarray, take: np.ndarray) -> None:
        """Prepare (re-prefill, admit the inbox's head, prefill) and plan these engines at once, file
        their completions, and park them until the next push or until one needs to decide."""
        now, s = self.env.now, self.samples
        n = len(idx)
        running, head, rest, tokens, all_owner, all_sid, all_fin, all_joined, is_new = admit_rows(
            owner, sid, fin, joined, in_owner, in_sid, take, progress, s.prompt, s.response, n)
        # both prefills' seconds in one pass: the KV re-prefill of what runs, then the new prompts
        secs = self._prefill(np.concatenate((idx, idx)), np.concatenate((np.where(reprefill, context, 0.0), tokens)))
        reprefill_end = np.where(reprefill, now + secs[:n], np.nan)
        after = np.where(reprefill, reprefill_end, now)
        has_new = head > 0
        prefill_end = np.where(has_new, after + secs[n:], np.nan)
        t0 = np.where(has_new, prefill_end, after)
        context1 = context + tokens
        flat = plan_flat(all_owner, all_sid, all_fin, all_joined, progress, context1, t0, self._kv[idx], rest > 0,
                         self._stack, self._table_of[idx], self.exit_tokens)
        is_new = is_new[flat.order]
        # completions: each engine's first rows, at the ends of their jumps (plus the reward)
        first_part = self.controller.plan_flat(flat, self._reward[idx])
        idle_end = (flat.n_done == np.diff(flat.rows)) & (rest == 0)
        p = Parked(idx, np.ones(n, bool), version, progress, context, context1, np.full(n, now), reprefill_end,
                   prefill_end, running, head, np.ones(n, bool), is_new, rest, idle_end, flat, t0, first_part)
        self.parked = [q for q in self.parked if q.alive.any()] + [p]
        self._place(idx, PARKED, p)
        for i in np.flatnonzero(rest).tolist():  # no room for them yet
            self.engines[idx[i]].inbox = in_sid[~take & (in_owner == i)]
        for i in np.flatnonzero(~idle_end & (np.diff(flat.jumps) > 0)).tolist():  # it decides when it ends
            end = float(flat.ends[flat.jumps[i + 1] - 1])
            timeout_at(self.env, end).callbacks.append(lambda _ev, p=p, i=i: self._ended(p, i))

    def _prefill(self, idx: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        if self._one_prefill is not None:
            return self._one_prefill.many(tokens)
        curves = [self.engines[i].prefill for i in idx]
        return np.array([c(t) for c, t in zip(curves, tokens.tolist(), strict=True)])

    def _ended(self, p: Parked, i: int) -> None:
        if p.alive[i]:
            self.unpark(self.engines[p.engines[i]], Resume("end"))

    def unpark(self, e: Engine, resume: Resume | None = None) -> None:
        """Hand a parked engine back to its process, in the state the per-engine path would have it
        in now (its plan in progress, its prefills' records caught up), and resume it."""
        p, i = e._parked, e._slot
        assert p is not None
        p.alive[i] = False
        e._parked = None
        flat, t0 = p.plan, float(p.t0[i])
        e.progress, e.version = int(p.progress[i]), int(p.version[i])
        if flat.jumps[i] == flat.jumps[i + 1]:  # idle
            e._plan = None
            e.batch = Batch(EMPTY, EMPTY, EMPTY)
            e.context = float(p.context[i])
            self._resume(e, Resume("woken"))
            return
        plan = flat.plan(i, t0)
        plan.chunk = Chunk(p.first_part + i)
        e._plan = plan
        if p.phases_open[i]:
            r0, r1 = int(flat.rows[i]), int(flat.rows[i + 1])
            new = p.is_new[r0:r1]
            new_sids = np.sort(plan.batch.sid[new])
            reprefill_end = float(p.reprefill_end[i]) if not np.isnan(p.reprefill_end[i]) else None
            prefill_end = float(p.prefill_end[i]) if not np.isnan(p.prefill_end[i]) else None
            admission = Admission(new_sids, deque(), e.inbox)
            joined = (plan.batch, float(p.context[i])) if len(new_sids) else None
            e._phases = Segment(True, float(p.seg_start[i]), reprefill_end, admission, joined, prefill_end, None, plan)
            e.batch = plan.batch.without(~new)
            e.context = float(p.context_pre[i])
            e.inbox = np.concatenate((new_sids, e.inbox)) if len(new_sids) else e.inbox
            e._catch_up()
        else:
            e._phases = None
            e.batch, e.context = plan.batch, float(p.context[i])
        if resume is None:  # interrupted (Engine._interrupt's rules)
            now = self.env.now
            if now < plan.ends[-1]:
                e._interrupted = True
                if now >= plan.t0:
                    self.interrupted.append((e, plan))
                resume = Resume("interrupt")
            else:
                resume = Resume("woken" if p.idle_end[i] else "end")
                if resume.action == "woken":
                    resume = Resume("end-woken")
        self._resume(e, resume)

    @staticmethod
    def _resume(e: Engine, resume: Resume) -> None:
        event, e._park = e._park, None
        assert event is not None
        event.succeed(resume)

    def push(self, version: int, ready_at: float) -> None:
        """The trainer pushes new weights: parked engines stop, and wait for them, as arrays; the
        others (and parked ones that must do something of their own first) hear it one by one."""
        request = (version, ready_at)
        loading = [g for p in self.parked if p.alive.any() for g in [self._stop(p, request)] if g is not None]
        self.parked = [p for p in self.parked if p.alive.any()]
        waits = self._where[:len(self.engines)] == LOADING  # they only note it: their weights are on the way
        self._upd_v[:len(waits)][waits], self._upd_t[:len(waits)][waits] = version, ready_at
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
                timeout_at(self.env, w).callbacks.append(lambda _ev, part=part: self._load_group(part, request))

    def _stop(self, p: Parked, request: tuple[int, float]) -> Loading | None:
        """Stop the parked engines that can at the push (see sim.bulk); returns them, waiting."""
        flat, stack = p.plan, self._stack
        ok, jcount, cutting, at, start, b, d, stop_at, finishing = stop_parked(
            flat.jumps, flat.ends, flat.b, flat.s, flat.k, flat.done, p.alive, p.t0, p.rest, p.idle_end,
            self._interruptible[p.engines], self._kv[p.engines], self._table_of[p.engines], stack.base, stack.slope,
            stack.ds, self.env.now, request[1])
        if not ok.any():
            return None
        return self._commit_stop(p, np.flatnonzero(ok), jcount, cutting, at, start, b, d, stop_at, finishing)

    def _commit_stop(self, p: Parked, stop: np.ndarray, jcount: np.ndarray, cutting: np.ndarray, at: np.ndarray,
                     start: np.ndarray, b: np.ndarray, d: np.ndarray, stop_at: np.ndarray, finishing: np.ndarray
                     ) -> Loading:
        """What `Engine._cut` (or `_commit` at the plan's end) does, for the engines in `stop`."""
        now, flat, s, rec = self.env.now, p.plan, self.samples, self.rec
        n = len(p.engines)
        self._record_phases(p, stop, now)
        chosen = np.zeros(n, bool)
        chosen[stop] = True
        p.alive[stop] = False
        gidx = p.engines
        cut_b, cut_d, finish = (np.zeros(n, np.int64) for _ in range(3))
        cut_b[cutting], cut_d[cutting], finish[cutting] = b, d, finishing
        progress, context, n_done, fate, *decoded = stop_rows(
            chosen, jcount, p.progress, p.context, flat.jumps, flat.k_through, flat.after, flat.cum, flat.offsets,
            flat.rows, flat.sid, self.exit_tokens, cut_b, cut_d, finish, gidx, p.version, flat.starts, flat.ends,
            flat.b)
        # jumps that have ended: recorded, their completions credited
        rec.fleet_intervals(self._names, self._groups, "decode", *decoded)
        rec.count(len(decoded[0]))
        self.controller.cut_parts(p.first_part + stop, n_done[stop])
        # the iteration in progress: it runs to its end, and completes the next jump's samples if last
        rec.fleet_intervals(self._names, self._groups, "decode", gidx[cutting], start, stop_at, p.version[cutting], b)
        rec.count(len(cutting))
        gone_sid, gone_version, gone_tokens, late_owner, late_rank, *stays = split_stopped(
            chosen, fate, n_done, flat.rows, flat.sid, flat.fin, flat.joined, p.version)
        s.credit(gone_sid, gone_version, gone_tokens)
        if len(late_owner):  # finished by the iteration in progress: in at its end
            ends = np.zeros(n)
            ends[cutting] = stop_at
            late = flat.sid[flat.rows[late_owner] + n_done[late_owner] + late_rank]
            self.controller.plan_parts(ends[late_owner] + self._reward[gidx[late_owner]], late, late_owner, late_rank,
                                       n)
        waiting_since = np.full(n, now)
        waiting_since[cutting] = stop_at
        keep = np.flatnonzero(chosen)
        g = Loading(p.engines[keep], p.version[keep], progress[keep], context[keep], waiting_since[keep], *stays)
        self._place(g.engines, LOADING, g)
        return g

    def _record_phases(self, p: Parked, which: np.ndarray, now: float, final: bool = False) -> None:
        """Record the re-prefills and prefills of engines `which` that have happened by now (all of
        an engine's or none, unless `final`: the run ends)."""
        re, pre = phases_done(which, p.phases_open, p.t0, p.reprefill_end, p.prefill_end, p.seg_start, p.engines,
                              p.version, p.n_pre, p.n_new, now, final)
        self.rec.fleet_intervals(self._names, self._groups, "reprefill", *re)
        self.rec.fleet_intervals(self._names, self._groups, "prefill", *pre)
        self.rec.count(len(re[0]) + len(pre[0]))

    def _load_group(self, g: Loading, request: tuple[int, float]) -> None:
        """`Engine._load_weights` and `_after_load` for engines that waited as arrays."""
        now, s = self.env.now, self.samples
        version = request[0]
        gidx = g.engines
        mine = (self._upd_v[gidx] == version) & (self._upd_t[gidx] == request[1])
        self._upd_v[gidx[mine]] = -1  # a newer request that came in meanwhile stays pending
        self._ver[gidx] = version
        sizes = g.count
        self.rec.fleet_intervals(self._names, self._groups, "weight_load", gidx, g.start, np.full(len(gidx), now),
                                 np.full(len(gidx), version), sizes)
        tokens, old = reload_rows(g.owner, g.sid, g.joined, g.progress, g.version, s.generated)
        s.credit(g.sid, old, tokens)
        g.version = np.full(len(gidx), version)
        self.controller.request_dispatch()
        self.rec.count(int((sizes == 0).sum()))
        self._plan_soon()
        self._to_plan.append(g)

    def loading_load(self, e: Engine) -> int:
        """Running and routed samples of an engine that waits for (or has just loaded) weights."""
        g = e._loading
        assert g is not None
        return int(g.count[e._slot] + g.inbox_count[e._slot])

    def router_view(self, version: int) -> tuple[np.ndarray, np.ndarray]:
        """Controller.dispatch's view of every engine at once: accepting, and its load."""
        n = len(self.engines)
        acc = (self._upd_v[:n] < 0) & (self._ver[:n] == version)
        loads = np.zeros(len(self.engines), np.int64)
        member = np.zeros(len(self.engines), bool)
        for g in self._to_plan:
            loads[g.engines] = g.count + g.inbox_count
            member[g.engines] = True
        for i in np.flatnonzero(acc & ~member).tolist():
            loads[i] = self.engines[i].load()
        return acc, loads

    def assign(self, engine: np.ndarray, sids: np.ndarray) -> None:
        """The router sends sids[i] to engine[i]: engines that just loaded as arrays take theirs as
        arrays; the others hear of their work in the order they got their first sample."""
        if len(engine) == 1 and not self._to_plan:  # the common case of a busy fleet: a freed slot refilled
            self.engines[int(engine[0])].assign(sids)
            return
        member = np.full(len(self.engines), -1)
        slot = np.zeros(len(self.engines), np.int64)
        for gi, g in enumerate(self._to_plan):
            member[g.engines] = gi
            slot[g.engines] = np.arange(len(g.engines))
        where = member[engine]
        for gi, g in enumerate(self._to_plan):
            mine = where == gi
            if mine.any():
                g.route(slot[engine[mine]], sids[mine])
        own = where < 0
        if not own.any():
            return
        engine, sids = engine[own], sids[own]
        order = np.argsort(engine, kind="stable")
        ranked, starts = np.unique(engine[order], return_index=True)
        groups = np.split(sids[order], starts[1:])
        for g in sorted(range(len(ranked)), key=lambda g: groups[g][0]):
            self.engines[int(ranked[g])].assign(groups[g])

    def parked_load(self, e: Engine) -> int:
        p, i = e._parked, e._slot
        assert p is not None
        return int(p.plan.rows[i + 1] - p.plan.rows[i]) - p.completed_by(i, self.env.now)

    def parked_queued(self, e: Engine) -> int:
        """Samples routed to a parked engine that its admission has not taken yet."""
        p, i = e._parked, e._slot
        assert p is not None
        admitted = not (p.reprefill_end[i] > self.env.now)  # it admits when its re-prefill ends
        return 0 if admitted else int(p.n_new[i])

    def flush(self) -> None:
        """The run ends: record what parked engines have done by now (prefills, and plans that ended)."""
        now = self.env.now
        for p in self.parked:
            alive = np.flatnonzero(p.alive)
            self._record_phases(p, alive, now, final=True)
            count = np.diff(p.plan.jumps)
            ended = alive[(count[alive] == 0) | (_before(p.plan.ends, p.plan.jumps[1:])[alive] <= now)]
            if len(ended):
                empty = np.empty(0, np.int64)
                self._commit_stop(p, ended, count, empty, empty, np.empty(0), empty, empty, np.empty(0), empty)

    def setup(self, controller: Controller, rec: Recorder) -> None:
        """Per-engine constants as arrays, once every engine has joined."""
        self.controller, self.rec = controller, rec
        controller.fleet = self
        es = self.engines
        self._max_batch = np.array([e.max_batch for e in es], np.int64)
        self._kv = np.array([e.kv_tokens for e in es], np.float64)
        self._room = self._kv * (1 - KV_WATERMARK)
        self._reward = np.array([e.reward_seconds for e in es], np.float64)
        self._interruptible = np.array([e.interruptible for e in es], bool)
        # the engines' decode tables as one stack (sim.costs.DecodeStack), and each engine's in it
        self._stack, self._table_of = stack_of([e.decode for e in es])
        # one prefill curve for every engine (one kind of engine): no list per call
        self._one_prefill = es[0].prefill if es and all(e.prefill is es[0].prefill for e in es) else None


def _before(values: np.ndarray, at: np.ndarray) -> np.ndarray:
    """values[at - 1], and 0 where at == 0 (for "the last jump before", where there may be none)."""
    return np.append(np.zeros(1, values.dtype), values)[at]


class Engine:
    def __init__(
        self, env: simpy.Environment, name: str, group: str, decode: DecodeTable, prefill: PrefillCurve,
        max_batch: int, kv_tokens: float, controller: Controller, recorder: Recorder, fleet: Fleet,
        reward_seconds: float, *, mean_iteration_s: tuple[float, ...], interruptible: bool,
    ) -> None:
        self.env, self.name, self.group = env, name, group
        self.decode, self.prefill = decode, prefill
        self.max_batch, self.kv_tokens = max_batch, kv_tokens
        self.controller, self.rec, self.fleet, self.reward_seconds = controller, recorder, fleet, reward_seconds
        self.samples: Samples = controller.samples
        self.interruptible = interruptible
        self.mean_iteration_s = mean_iteration_s
        self.index = fleet.add(self)  # its version, update and parking live in the fleet's arrays
        self.version = 0
        self.progress = 0  # decode iterations run so far
        self.context = 0.0  # total tokens held in the KV cache by running samples
        self.batch = Batch(EMPTY, EMPTY, EMPTY)
        self.waiting: deque[int] = deque()  # preempted samples, first in line
        self.inbox = EMPTY  # routed here, not yet admitted
        self.update: tuple[int, float] | None = None  # (version, time the new weights are in)
        self._wake: simpy.Event | None = None  # idle: waiting for work
        self._plan: Plan | None = None  # decoding: the plan in progress
        self._phases: Segment | None = None  # its prefills, while time has not passed them all
        self._interrupted = False  # an interrupt is on its way to the plan in progress
        # parked with the fleet (sim.bulk): its state lives in the fleet's arrays meanwhile, and its
        # process waits on `_park` until the fleet hands it back
        self._park: simpy.Event | None = None
        controller.engines.append(self)
        self.proc = env.process(self.run())

    # ---- state kept in the fleet's arrays (so that it moves many engines at once) --------------
    @property
    def version(self) -> int:
        """The policy version of the weights it runs."""
        return int(self.fleet._ver[self.index])

    @version.setter
    def version(self, version: int) -> None:
        self.fleet._ver[self.index] = version

    @property
    def update(self) -> tuple[int, float] | None:
        """A pending weight update: (version, time the new weights are in), or None."""
        v = self.fleet._upd_v[self.index]
        return None if v < 0 else (int(v), float(self.fleet._upd_t[self.index]))

    @update.setter
    def update(self, request: tuple[int, float] | None) -> None:
        if request is None:
            self.fleet._upd_v[self.index] = -1
        else:
            self.fleet._upd_v[self.index], self.fleet._upd_t[self.index] = request

    def _home_if(self, where: int) -> Any:
        """Its Parked or Loading when the fleet holds it there (`where`), else None."""
        return self.fleet._home[self.index] if self.fleet._where[self.index] == where else None

    def _leave(self, where: int) -> None:
        """Back to its own process, if the fleet held it in `where` (only the fleet puts it there)."""
        if self.fleet._where[self.index] == where:
            self.fleet._place([self.index], OWN, None)

    @property
    def _parked(self) -> Parked | None:
        """Parked with the fleet (sim.bulk): its state lives in the fleet's arrays meanwhile, and its
        process waits on `_park` until the fleet hands it back."""
        return self._home_if(PARKED)

    @_parked.setter
    def _parked(self, parked: None) -> None:
        assert parked is None, "the fleet parks engines (Fleet._place)"
        self._leave(PARKED)

    @property
    def _loading(self) -> Loading | None:
        """Stopped with the fleet for a weight push: waiting for (or just given) the weights as arrays."""
        return self._home_if(LOADING)

    @_loading.setter
    def _loading(self, loading: None) -> None:
        assert loading is None, "the fleet stops engines (Fleet._place)"
        self._leave(LOADING)

    @property
    def _slot(self) -> int:
        """Its index in the arrays of its Parked or Loading."""
        return int(self.fleet._slot[self.index])

    # ---- the router's view (sim.controller.Worker) ------------------------------------------
    def accepting(self, version: int) -> bool:
        """New samples start under the current weights only: none while an update is pending."""
        return self.update is None and self.version == version

    def load(self) -> int:
        if self._parked is not None:
            return self.fleet.parked_load(self) + len(self.waiting) + len(self.inbox)
        if self._loading is not None:
            return self.fleet.loading_load(self) + len(self.waiting) + len(self.inbox)
        self._catch_up()
        running = len(self.batch)
        if self._plan is not None:  # samples whose jump has ended are gone already
            running -= self._plan.completed_before(int(np.searchsorted(self._plan.ends, self.env.now, "right")))
        return running + len(self.waiting) + len(self.inbox)

    def capacity(self) -> int:
        return self.max_batch

    def queued(self) -> int:
        """Samples waiting for admission (the queue plot)."""
        if self._parked is not None:
            return self.fleet.parked_queued(self) + len(self.waiting) + len(self.inbox)
        if self._loading is not None:
            return int(self._loading.inbox_count[self._slot]) + len(self.waiting) + len(self.inbox)
        self._catch_up()
        return len(self.waiting) + len(self.inbox)

    def assign(self, sids: np.ndarray) -> None:
        """The router sent requests: stop at the next iteration boundary and admit them."""
        self.inbox = np.concatenate((self.inbox, sids)) if len(self.inbox) else sids
        self._interrupt()

    def request_update(self, version: int, ready_at: float) -> None:
        self.update = (version, ready_at)
        self._interrupt()

    def _interrupt(self) -> None:
        if self._parked is not None:  # it has something of its own to do: back to its process
            self.fleet.unpark(self)
            return
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()
        elif self._plan is not None and not self._interrupted and self.env.now < self._plan.ends[-1]:
            # a plan that ends this very instant is not cut short: the engine stops there anyway
            self._interrupted = True
            if self.env.now >= self._plan.t0:  # decoding already, not still in a prefill
                self.fleet.interrupted.append((self, self._plan))
            self.proc.interrupt()

    # ---- the loop -------------------------------------------------------------------------
    def run(self) -> Generator[simpy.Event, Any, None]:
        woken = False
        segment: Segment | Resume
        while True:
            if self.update is not None and (self.interruptible or not len(self.batch)):
                if self.update[1] > self.env.now:  # engines waiting for the same weights load together
                    segment = yield self.fleet.load(self)
                else:
                    self._load_weights(self.update, self.env.now)
                    decision = self._after_load()
                    segment = (yield decision) if isinstance(decision, simpy.Event) else decision
            elif woken and self._quiet():
                # routed to while idle, as many others are at once: plan together at the end of the
                # instant (quiet: no more work can come this instant)
                segment = yield self.fleet.ask(self, False)
            else:
                segment = self._prepare(False)
            woken = False
            if isinstance(segment, Resume):  # it was parked with the fleet meanwhile
                woken = yield from self._resume(segment)
                continue
            if segment.plan is None and segment.request is not None:
                self.fleet.plan([segment])
            if not (yield from self._run(segment)):
                self._wake = self.env.event()
                yield self._wake
                self._wake, woken = None, True

    def _resume(self, resume: Resume) -> Generator[simpy.Event, Any, bool]:
        """Carry on as `_decode` would from the interrupt or the end of the plan the fleet handed back
        (Fleet.unpark); True: it is idle, and woken now."""
        plan = self._plan
        if plan is None:
            return True
        self._plan = None
        if resume.action == "interrupt":
            self._catch_up()
            if self._phases is not None:
                yield from self._finish_prefills(plan)
            else:
                self._start_decoding(plan)
                yield from self._cut(plan)
            self._interrupted = False
            return False
        self._interrupted = False
        self._catch_up()
        self._start_decoding(plan)
        self._commit(plan, len(plan.k))
        self._preempt()
        return resume.action == "end-woken"

    def _quiet(self) -> bool:
        """Nothing but an interrupt can reach this engine: it may plan past its next decisions."""
        return self.update is None and self.controller.allowance() <= 0

    def _prepare(self, reprefill: bool) -> Segment:
        """KV re-prefill, admission and prefill, then decode: as far as the engine can see now.

        When quiet, all of it is decided now (and the decode plan's completions filed at once).
        Otherwise only the first of them: then the loop looks again (new requests or an update may
        be waiting by then).
        """
        quiet = self._quiet()
        t = self.env.now
        reprefill_end = None
        if reprefill:
            reprefill_end = t = t + self.prefill(self.context)
        admission = self._admission()
        joined, prefill_end = None, None
        if len(admission.sids) and (quiet or not reprefill):
            batch, context, tokens = self._joined(admission.sids, fresh=admission.fresh)
            joined = (batch, context)
            prefill_end = t = t + self.prefill(tokens)
        else:
            batch, context = self.batch, self.context
        request = None
        if len(batch) and (quiet or not (reprefill or len(admission.sids))):
            # after a completion the engine would admit what waits, or what new requests bring
            stop = not quiet or bool(admission.waiting) or len(admission.inbox) > 0
            request = Request(batch, self.progress, context, t, self.kv_tokens, self.decode, stop)
        return Segment(quiet, self.env.now, reprefill_end, admission, joined, prefill_end, request)

    def _prepare_routed(self, reprefill: bool, new: Batch, tokens: int) -> Segment:
        """`_prepare` when quiet with nothing preempted waiting, and `new` (the inbox's head) all fits."""
        now = self.env.now
        reprefill_end = now + self.prefill(self.context) if reprefill else None
        context = self.context + tokens
        prefill_end = t = (now if reprefill_end is None else reprefill_end) + self.prefill(tokens)
        inbox = self.inbox[len(new):]
        admission = Admission(new.sid, self.waiting, inbox)
        joined = (new, context)  # Fleet._plan_all puts the whole batch, as the plan sorted it, in here
        request = Request(self.batch, self.progress, context, t, self.kv_tokens, self.decode, len(inbox) > 0, new)
        return Segment(True, now, reprefill_end, admission, joined, prefill_end, request)

    def _run(self, sg: Segment) -> Generator[simpy.Event, Any, bool]:
        """Carry out a segment; an update arriving during a prefill voids the rest. False: idle."""
        n = int(sg.plan.done.sum()) if sg.plan is not None else 0
        if n:
            sg.plan.chunk = self.controller.plan(np.repeat(sg.plan.ends, sg.plan.done) + self.reward_seconds,
                                                 sg.plan.batch.sid[:n])
        if sg.quiet and sg.plan is not None:
            # its prefills need no events of their own: they happen inside the plan's one wait, and
            # are recorded as time passes them (`_catch_up`)
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

    def _catch_up(self) -> None:
        """The prefills of the plan in progress that time has reached have happened: the re-prefill
        ends, then what it admits joins (the queues change), then their prefill ends."""
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

    def _finish_prefills(self, plan: Plan) -> Generator[simpy.Event, Any, None]:
        """An update came during a prefill: that prefill completes, the rest of the plan does not (the
        engine loads the new weights first, as the reference does)."""
        sg = self._phases
        assert sg is not None
        self._drop(plan)
        if sg.reprefill_end is not None:  # still re-prefilling: nothing is admitted before the load
            sg.joined, sg.prefill_end = None, None
            yield timeout_at(self.env, sg.reprefill_end)
        else:
            yield timeout_at(self.env, sg.prefill_end)  # type: ignore[arg-type]
        self._catch_up()

    # ---- admission ------------------------------------------------------------------------
    def _admission(self) -> Admission:
        """Which waiting, then routed, samples join the batch now (vLLM admits while KV room lasts)."""
        waiting, inbox = self.waiting, self.inbox
        if self.update is not None or not (waiting or len(inbox)):  # a draining engine admits nothing
            return Admission(EMPTY, waiting, inbox)
        s = self.samples
        running = len(self.batch)
        room = self.kv_tokens * (1 - KV_WATERMARK)
        new: list[int] = []
        if waiting:
            waiting = deque(waiting)
            while waiting and self._fits(running, len(new), int(s.prompt[waiting[0]] + s.generated[waiting[0]]),
                                         room):
                new.append(waiting.popleft())
        ids = np.array(new, dtype=np.int64) if new else EMPTY
        if not waiting and len(inbox):
            # routed samples in order while the batch has room and each fits; the first that does
            # not fit waits (it is first in line then), and the rest stay in the inbox
            head = inbox[:max(0, self.max_batch - running - len(new))]
            fits = self.context + s.prompt[head] + 1 <= room  # routed samples have generated nothing yet
            if running == 0 and not new and len(head):
                fits[0] = True  # an empty engine always takes one, however long
            n = len(head) if fits.all() else int(np.argmin(fits))
            ids = np.concatenate((ids, head[:n])) if new else head[:n]
            if n < len(head):
                waiting = deque([int(head[n])])
                n += 1
            inbox = inbox[n:]
        return Admission(ids, waiting, inbox, fresh=not new)

    def _fits(self, running: int, pending: int, tokens: int, room: float) -> bool:
        if running + pending >= self.max_batch:
            return False
        # vLLM admits only while a watermark of the cache stays free (1% of blocks): a preempted
        # sample re-admitted with one token to spare would overflow and be preempted again at once
        return (not running and not pending) or self.context + tokens + 1 <= room

    def _joined(self, ids: np.ndarray, fresh: bool) -> tuple[Batch, float, int]:
        """The batch, KV context and prefill tokens once `ids` have joined (`fresh`: none was preempted)."""
        s = self.samples
        if fresh:  # routed samples: nothing generated yet
            tokens, finish = int(s.prompt[ids].sum()), self.progress + s.response[ids]
        else:
            generated = s.generated[ids]
            tokens = int(s.prompt[ids].sum() + generated.sum())
            finish = self.progress + s.response[ids] - generated
        joined = np.full(len(ids), self.progress, np.int64)
        batch = self.batch.plus(ids, finish, joined) if len(self.batch) else Batch(ids, finish, joined)
        # integers all along: the sum is exact, whatever the order the reference adds them in
        return batch, self.context + tokens, tokens

    def _admit(self, admission: Admission, batch: Batch, context: float) -> None:
        self.waiting, self.inbox = admission.waiting, admission.inbox
        self.batch, self.context = batch, context

    # ---- decoding -------------------------------------------------------------------------
    def _drop(self, plan: Plan | None) -> None:
        if plan is not None and plan.chunk is not None:
            self.controller.cut(plan.chunk, 0)

    def _decode(self, plan: Plan) -> Generator[simpy.Event, Any, None]:
        self._plan = plan
        if self._phases is None:
            self._start_decoding(plan)
        try:
            yield timeout_at(self.env, float(plan.ends[-1]))
        except simpy.Interrupt:  # finish the iteration in progress, then stop
            self._plan = None
            self._catch_up()
            if self._phases is not None:
                yield from self._finish_prefills(plan)
                return
            self._start_decoding(plan)
            yield from self._cut(plan)
            return
        finally:
            self._plan, self._interrupted = None, False
        self._catch_up()
        self._start_decoding(plan)
        self._commit(plan, len(plan.k))
        self._preempt()

    def _start_decoding(self, plan: Plan) -> None:
        assert len(plan.batch) == len(self.batch)  # the same samples, sorted by the plan
        self.batch = plan.batch

    def _cut(self, plan: Plan) -> Generator[simpy.Event, Any, None]:
        """Interrupted now: keep what happened, finish the iteration in progress (sim.planning.cut_many)."""
        cut = self.fleet.cut(self, plan)
        j, done, rest = cut.jumps, cut.iterations, cut.rest
        if plan.chunk is not None:
            self.controller.cut(plan.chunk, plan.completed_before(j))
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
        if finished:  # it ends now, not when planned: file the completions again, at now
            sids = self.batch.sid[:finished]
            self.context -= float(self.samples.exit_tokens[sids].sum())
            self.controller.plan(np.full(finished, self.env.now + self.reward_seconds), sids)
            self._complete(finished, now=True)
        self._preempt()

    def _commit(self, plan: Plan, j: int) -> None:
        """The first j jumps of the plan have happened: count them, record them, complete their samples."""
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
        """vLLM-style recompute preemption: while the KV cache overflows, the newest sample leaves."""
        s = self.samples
        while self.context > self.kv_tokens and len(self.batch) > 1:
            i = int(np.lexsort((self.batch.sid, self.batch.joined))[-1])  # newest joined, then highest id
            sid, joined = int(self.batch.sid[i]), int(self.batch.joined[i])
            self.batch = self.batch.without(np.arange(len(self.batch)) != i)
            tokens = self.progress - joined
            s.credit(np.array([sid]), self.version, np.array([tokens]))
            s.generated[sid] += tokens
            self.context -= int(s.prompt[sid] + s.generated[sid])
            self.waiting.appendleft(sid)

    def _load_weights(self, request: tuple[int, float], start: float) -> None:
        """The weights of `request` are in (it was waited for since `start`)."""
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

    def _after_load(self, event: simpy.Event | None = None) -> Segment | simpy.Event:
        """What to do once loaded: a Segment now, or an event that brings one at the end of the instant.

        It re-prefills, then admits what this instant's routing brings; or, idle, it would sleep until
        the router wakes it: either way it plans after the routing, with the others that load now.
        """
        reprefill = len(self.batch) > 0
        if reprefill or not (self.waiting or len(self.inbox)):
            return self.fleet.ask(self, reprefill, event)
        segment = self._prepare(False)  # admits what it already holds at once, as the reference does
        if event is not None:
            event.succeed(segment)
        return segment
