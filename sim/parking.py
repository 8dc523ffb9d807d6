"""Parking: engines moved through a step as arrays, without their processes (sim.engine_groups).

Engines whose decode plan holds no decision until the next push are parked: the fleet lays out
their prefills and decode plans as one set of arrays (`park_all`), stops them together at the push
(`stop_all`), loads their weights together (`load_group`) and parks them again. An engine leaves
(`unpark`) as soon as something happens to it alone, in the state its own process would have it
in, and carries on there; its process waits meanwhile on an event this class holds.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import simpy

from sim.admission import Admission
from sim.clock import timeout_at
from sim.controller import Controller
from sim.decode_plans import EMPTY, Batch, flat_decode_plans
from sim.engine import Engine
from sim.engine_groups import Loading, Parked
from sim.fleet_state import LOADING, OWN, PARKED, EngineConstants, EngineTable, Resume
from sim.kernels.fleet_passes import (
    admissible,
    admit_rows,
    phases_done,
    reload_rows,
    split_stopped,
    stop_parked,
    stop_rows,
)
from sim.recorder import Recorder
from sim.samples import Samples
from sim.segment import Segment


class Parking:
    """The parked engines' groups, the events their processes wait on, and the array passes that
    move them (the fleet's batched parking, stopping, loading and admission)."""

    def __init__(self, env: simpy.Environment, samples: Samples, engines: list[Engine], table: EngineTable,
                 consts: EngineConstants, controller: Controller, rec: Recorder) -> None:
        self.env, self.samples, self.exit_tokens = env, samples, samples.exit_tokens
        self.engines, self.table, self.consts = engines, table, consts
        self.controller, self.rec = controller, rec
        self.parked: list[Parked] = []
        self._events: dict[int, simpy.Event] = {}  # engine index -> what its process waits on while parked
        self._names = [e.name for e in engines]
        self._groups = [e.group for e in engines]

    def park_all(self, asking: list[tuple[Engine, bool, simpy.Event]], groups: list[Loading]
                 ) -> list[tuple[Engine, bool, simpy.Event]]:
        """Park the engines deciding now (`asking`, and the loaded `groups`) whose decode plan holds
        no decision: quiet, nothing preempted waiting, every routed sample it admits fits. The others
        are returned, to decide one by one (those that loaded as arrays get their state back first)."""
        quiet = self.controller.allowance() <= 0
        rest: list[tuple[Engine, bool, simpy.Event]] = []
        own: list[int] = []
        own_reprefill: list[bool] = []
        for e, rp, event in asking:
            if quiet and e.update is None and not e.waiting:
                self._events[e.index] = event
                if self.table.where[e.index] == LOADING:
                    self.table.place([e.index], OWN, None)
                own.append(e.index)
                own_reprefill.append(rp)
            else:
                rest.append((e, rp, event))
        parts = [self._rows_of(own)] if own else []
        for i in own:  # their inbox is in the arrays now (those that decide alone get theirs back)
            self.engines[i].inbox = EMPTY
        idx_parts = [np.array(own, np.int64)]
        reprefill_parts = [np.array(own_reprefill, bool)]
        free_parts = [np.ones(len(own), bool)]  # no update pending, nothing preempted waiting
        offset = len(own)
        for g in groups:
            # they come back from the arrays (those that decide alone get their state back below).
            # Nothing was preempted waiting on them when they parked, and nothing can have joined
            # their queues since (their process slept; the router sends them work as arrays): an
            # update that came in meanwhile is all that can keep them from parking again
            self.table.place(g.engines, OWN, None)
            free_parts.append(self.table.update_version[g.engines] < 0)
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
        if not ok.all():  # those engines decide one by one, from their own state
            for i in np.flatnonzero(~ok).tolist():
                e = self.engines[idx[i]]
                e.progress, e.context = int(progress[i]), float(context[i])
                rows = owner == i
                e.batch = Batch(sid[rows], fin[rows], joined[rows])
                e.inbox = in_sid[in_owner == i]
                rest.append((e, bool(reprefill[i]), self._events.pop(e.index)))
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
        """The state of engines deciding on their own, as the arrays a Loading holds."""
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
        return admissible(np.asarray(free, bool), owner, context, in_owner, in_sid, self.consts.max_batch[idx],
                          self.consts.room[idx], self.samples.prompt)

    def _park(self, idx: np.ndarray, owner: np.ndarray, sid: np.ndarray, fin: np.ndarray, joined: np.ndarray,
              progress: np.ndarray, context: np.ndarray, version: np.ndarray, reprefill: np.ndarray,
              in_owner: np.ndarray, in_sid: np.ndarray, take: np.ndarray) -> None:
        """Prepare (re-prefill, admit the inbox's head, prefill) and lay out these engines' decode plans at once, file
        their completions, and park them until the next push or until one needs to decide."""
        now, s = self.env.now, self.samples
        n = len(idx)
        running, head, rest, tokens, all_owner, all_sid, all_fin, all_joined, is_new = admit_rows(
            owner, sid, fin, joined, in_owner, in_sid, take, progress, s.prompt, s.response, n)
        prefill = tokens
        if s.cached is not None:  # episodes back from a tool call: their prefix is not prefilled again
            prefill = tokens - np.bincount(in_owner[take], s.cached[in_sid[take]], minlength=n)
        # both prefills' seconds in one pass: the KV re-prefill of what runs, then the new prompts
        secs = self._prefill(np.concatenate((idx, idx)), np.concatenate((np.where(reprefill, context, 0.0), prefill)))
        reprefill_end = np.where(reprefill, now + secs[:n], np.nan)
        after = np.where(reprefill, reprefill_end, now)
        has_new = head > 0
        prefill_end = np.where(has_new, after + secs[n:], np.nan)
        t0 = np.where(has_new, prefill_end, after)
        context1 = context + tokens
        c = self.consts
        flat = flat_decode_plans(all_owner, all_sid, all_fin, all_joined, progress, context1, t0, c.kv[idx], rest > 0,
                                 c.stack, c.table_of[idx], self.exit_tokens)
        is_new = is_new[flat.order]
        # completions: each engine's first rows, at the ends of their jumps (plus the reward)
        first_part = self.controller.file_plans(flat, c.reward[idx], version)
        idle_end = (flat.n_done == np.diff(flat.rows)) & (rest == 0)
        p = Parked(idx, np.ones(n, bool), version, progress, context, context1, np.full(n, now), reprefill_end,
                   prefill_end, running, head, np.ones(n, bool), is_new, rest, idle_end, flat, t0, first_part)
        self.parked = [q for q in self.parked if q.alive.any()] + [p]
        self.table.place(idx, PARKED, p)
        for i in np.flatnonzero(rest).tolist():  # no room for them yet
            self.engines[idx[i]].inbox = in_sid[~take & (in_owner == i)]
        for i in np.flatnonzero(~idle_end & (np.diff(flat.jumps) > 0)).tolist():  # it decides when it ends
            end = float(flat.ends[flat.jumps[i + 1] - 1])
            timeout_at(self.env, end).callbacks.append(lambda _ev, p=p, i=i: self._ended(p, i))

    def _prefill(self, idx: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        if self.consts.one_prefill is not None:
            return self.consts.one_prefill.many(tokens)
        curves = [self.engines[i].prefill for i in idx]
        return np.array([c(t) for c, t in zip(curves, tokens.tolist(), strict=True)])

    def _ended(self, p: Parked, i: int) -> None:
        if p.alive[i]:
            self.unpark(self.engines[p.engines[i]], Resume.END)

    def unpark(self, e: Engine, resume: Resume | None = None) -> None:
        """Hand a parked engine back to its process, in the state the per-engine path would have it
        in now (its decode plan in progress, its prefills' records caught up), and resume it."""
        p, i = self.table.held(e.index, PARKED), int(self.table.slot[e.index])
        assert isinstance(p, Parked)
        p.alive[i] = False
        self.table.place([e.index], OWN, None)
        flat, t0 = p.plans, float(p.t0[i])
        progress, version = int(p.progress[i]), int(p.version[i])
        if flat.jumps[i] == flat.jumps[i + 1]:  # idle
            e.restore_idle(progress, version, float(p.context[i]))
            self._resume(e, Resume.WOKEN)
            return
        plan = flat.of_engine(i, t0)
        plan.part = p.first_part + i
        if p.phases_open[i]:
            r0, r1 = int(flat.rows[i]), int(flat.rows[i + 1])
            new = p.is_new[r0:r1]
            new_sids = np.sort(plan.batch.sid[new])
            reprefill_end = float(p.reprefill_end[i]) if not np.isnan(p.reprefill_end[i]) else None
            prefill_end = float(p.prefill_end[i]) if not np.isnan(p.prefill_end[i]) else None
            admission = Admission(new_sids, deque(), e.inbox, seen=len(new_sids) + len(e.inbox))
            joined = (plan.batch, float(p.context[i])) if len(new_sids) else None
            phases = Segment(True, float(p.seg_start[i]), reprefill_end, admission, joined, prefill_end, None, plan)
            inbox = np.concatenate((new_sids, e.inbox)) if len(new_sids) else e.inbox
            e.restore_decoding(progress, version, plan, plan.batch.without(~new), float(p.context_pre[i]), phases,
                               inbox)
        else:
            e.restore_decoding(progress, version, plan, plan.batch, float(p.context[i]), None, e.inbox)
        if resume is None:  # interrupted (the rules of Engine's interrupt)
            if self.env.now < plan.ends[-1]:
                e.mark_interrupted()
                resume = Resume.INTERRUPT
            else:
                resume = Resume.END_WOKEN if p.idle_end[i] else Resume.END
        self._resume(e, resume)

    def _resume(self, e: Engine, resume: Resume) -> None:
        self._events.pop(e.index).succeed(resume)

    # ---- stopping at a push, loading ------------------------------------------------------------
    def stop_all(self, request: tuple[int, float]) -> list[Loading]:
        """The trainer pushes `request` (version, when its weights are in): the parked engines that
        can stop now do, as arrays; returns them, waiting for the weights."""
        loading = [g for p in self.parked if p.alive.any() for g in [self._stop(p, request)] if g is not None]
        self.parked = [p for p in self.parked if p.alive.any()]
        return loading

    def _stop(self, p: Parked, request: tuple[int, float]) -> Loading | None:
        """Stop the parked engines of `p` that can at the push (see sim.engine_groups); returns them, waiting."""
        flat, c = p.plans, self.consts
        stack = c.stack
        ok, jcount, cutting, at, start, b, d, stop_at, finishing = stop_parked(
            flat.jumps, flat.ends, flat.b, flat.s, flat.k, flat.done, p.alive, p.t0, p.rest, p.idle_end,
            c.interruptible[p.engines], c.kv[p.engines], c.table_of[p.engines], stack.base, stack.slope,
            stack.ds, self.env.now, request[1])
        if not ok.any():
            return None
        return self._commit_stop(p, np.flatnonzero(ok), jcount, cutting, at, start, b, d, stop_at, finishing)

    def _commit_stop(self, p: Parked, stop: np.ndarray, jcount: np.ndarray, cutting: np.ndarray, at: np.ndarray,
                     start: np.ndarray, b: np.ndarray, d: np.ndarray, stop_at: np.ndarray, finishing: np.ndarray
                     ) -> Loading:
        """What an engine's cut (or its commit at the decode plan's end) does, for the engines in `stop`."""
        now, flat, s, rec = self.env.now, p.plans, self.samples, self.rec
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
            self.controller.file_parts(ends[late_owner] + self.consts.reward[gidx[late_owner]], late, late_owner,
                                       late_rank, n, p.version[late_owner])
        waiting_since = np.full(n, now)
        waiting_since[cutting] = stop_at
        keep = np.flatnonzero(chosen)
        g = Loading(p.engines[keep], p.version[keep], progress[keep], context[keep], waiting_since[keep], *stays)
        self.table.place(g.engines, LOADING, g)
        return g

    def _record_phases(self, p: Parked, which: np.ndarray, now: float, final: bool = False) -> None:
        """Record the re-prefills and prefills of engines `which` that have happened by now (all of
        an engine's or none, unless `final`: the run ends)."""
        re, pre = phases_done(which, p.phases_open, p.t0, p.reprefill_end, p.prefill_end, p.seg_start, p.engines,
                              p.version, p.n_pre, p.n_new, now, final)
        self.rec.fleet_intervals(self._names, self._groups, "reprefill", *re)
        self.rec.fleet_intervals(self._names, self._groups, "prefill", *pre)
        self.rec.count(len(re[0]) + len(pre[0]))

    def load_group(self, g: Loading, request: tuple[int, float]) -> None:
        """Engine.load_weights for engines that waited as arrays (the fleet then has them decide)."""
        now, s = self.env.now, self.samples
        version = request[0]
        gidx = g.engines
        t = self.table
        mine = (t.update_version[gidx] == version) & (t.update_ready[gidx] == request[1])
        t.update_version[gidx[mine]] = -1  # a newer request that came in meanwhile stays pending
        t.version[gidx] = version
        sizes = g.count
        self.rec.fleet_intervals(self._names, self._groups, "weight_load", gidx, g.start, np.full(len(gidx), now),
                                 np.full(len(gidx), version), sizes)
        tokens, old = reload_rows(g.owner, g.sid, g.joined, g.progress, g.version, s.generated)
        s.credit(g.sid, old, tokens)
        g.version = np.full(len(gidx), version)
        self.controller.request_dispatch()
        self.rec.count(int((sizes == 0).sum()))

    # ---- what the fleet's engines hold while here ----------------------------------------------
    def _home(self, e: int, where: int) -> tuple[Parked | Loading, int]:
        home = self.table.held(e, where)
        assert home is not None
        return home, int(self.table.slot[e])

    def loading_load(self, e: int) -> int:
        """Running and routed samples of engine e, waiting for (or just given) weights as arrays."""
        g, i = self._home(e, LOADING)
        assert isinstance(g, Loading)
        return int(g.count[i] + g.inbox_count[i])

    def loading_queued(self, e: int) -> int:
        """Samples routed to engine e while it waits for weights as arrays."""
        g, i = self._home(e, LOADING)
        assert isinstance(g, Loading)
        return int(g.inbox_count[i])

    def parked_load(self, e: int) -> int:
        """Samples parked engine e still runs (those whose jump has ended are gone)."""
        p, i = self._home(e, PARKED)
        assert isinstance(p, Parked)
        return int(p.plans.rows[i + 1] - p.plans.rows[i]) - p.completed_by(i, self.env.now)

    def parked_queued(self, e: int) -> int:
        """Samples routed to parked engine e that its admission has not taken yet."""
        p, i = self._home(e, PARKED)
        assert isinstance(p, Parked)
        admitted = not (p.reprefill_end[i] > self.env.now)  # it admits when its re-prefill ends
        return 0 if admitted else int(p.n_new[i])

    def flush(self) -> None:
        """The run ends: record what parked engines have done by now (prefills, and decode plans that ended)."""
        now = self.env.now
        for p in self.parked:
            alive = np.flatnonzero(p.alive)
            self._record_phases(p, alive, now, final=True)
            count = np.diff(p.plans.jumps)
            ended = alive[(count[alive] == 0) | (_before(p.plans.ends, p.plans.jumps[1:])[alive] <= now)]
            if len(ended):
                empty = np.empty(0, np.int64)
                self._commit_stop(p, ended, count, empty, empty, np.empty(0), empty, empty, np.empty(0), empty)


def _before(values: np.ndarray, at: np.ndarray) -> np.ndarray:
    """values[at - 1], and 0 where at == 0 (for "the last jump before", where there may be none)."""
    return np.append(np.zeros(1, values.dtype), values)[at]

