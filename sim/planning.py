"""Decode plans in closed form, for many engines at once.

An engine's running batch only changes at completions (and KV preemption), so until then its
future is arithmetic: with the samples sorted by the iteration at which they finish, jump j runs
b_j samples from one finishing point to the next, k_j iterations from total context s_j, and takes
DecodeTable.total(b_j, s_j, k_j) seconds. `plan_many` lays out those jumps for every engine that
asks in the same instant as one set of numpy arrays (engines that load new weights together plan
together), cut where an engine's KV cache would overflow or where it has a decision to take.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.costs import DecodeTable
from sim.kernels import first_jump, plan_clock, plan_jumps
from sim.pending import Chunk


@dataclass(slots=True)
class Batch:
    """Running samples. While a plan runs they are sorted by (finish, sid), so completions always
    leave from the front; samples joining are appended, and the next plan sorts them."""

    sid: np.ndarray
    finish: np.ndarray  # engine progress (iterations) at which it has generated its whole response
    joined: np.ndarray  # progress since which its tokens are not yet credited

    def __len__(self) -> int:
        return len(self.sid)

    def plus(self, sid: np.ndarray, finish: np.ndarray, joined: np.ndarray) -> Batch:
        return Batch(np.concatenate((self.sid, sid)), np.concatenate((self.finish, finish)),
                     np.concatenate((self.joined, joined)))

    def without(self, keep: np.ndarray | slice) -> Batch:
        return Batch(self.sid[keep], self.finish[keep], self.joined[keep])


@dataclass(slots=True)
class Plan:
    """Decode jumps from `t0`: jump j runs `b[j]` samples for `k[j]` iterations from total context
    `s[j]`, ends at `ends[j]`, and completes the next `done[j]` samples of the batch."""

    t0: float
    b: np.ndarray
    s: np.ndarray
    k: np.ndarray
    ends: np.ndarray
    done: np.ndarray
    after: np.ndarray  # KV context after each jump and its completions
    batch: Batch  # the batch it runs, sorted
    done_through: np.ndarray  # [j]: samples completed by jumps 0..j, plus `done_offset`
    done_offset: int
    starts: np.ndarray  # [j]: when jump j starts (t0, then the previous end)
    k_through: np.ndarray  # [j]: iterations of jumps 0..j
    chunk: Chunk | None = None  # its completions, as filed with the controller

    def completed_before(self, j: int) -> int:
        return int(self.done_through[j - 1]) - self.done_offset if j else 0


@dataclass(slots=True)
class Request:
    """One engine's batch and state when it plans (see Engine._prepare)."""

    batch: Batch
    progress: int
    context: float
    t0: float
    kv_tokens: float
    decode: DecodeTable
    stop_at_completion: bool  # it has a decision to take at its first completion
    new: Batch | None = None  # samples joining the batch (kept apart: the plan sorts them in)


@dataclass(slots=True)
class FlatPlans:
    """The plans of many engines as one set of arrays (engine e owns rows[e]:rows[e+1] of the
    running samples, sorted by (finish, sid), and jumps[e]:jumps[e+1] of the jumps)."""

    rows: np.ndarray  # [E+1]
    sid: np.ndarray
    fin: np.ndarray
    joined: np.ndarray
    jumps: np.ndarray  # [E+1]
    je: np.ndarray  # engine of each jump
    b: np.ndarray
    s: np.ndarray
    k: np.ndarray
    ends: np.ndarray
    starts: np.ndarray
    done: np.ndarray
    after: np.ndarray
    cum: np.ndarray  # samples completed by jumps 0..j, counted across engines
    offsets: np.ndarray  # [E]: cum before each engine's first jump
    k_through: np.ndarray
    order: np.ndarray  # rows[r] is input sample order[r]

    def plan(self, e: int, t0: float) -> Plan:
        """Engine e's plan on its own."""
        lo, hi, r0, r1 = (int(x) for x in (self.jumps[e], self.jumps[e + 1], self.rows[e], self.rows[e + 1]))
        batch = Batch(self.sid[r0:r1], self.fin[r0:r1], self.joined[r0:r1])
        return Plan(t0, self.b[lo:hi], self.s[lo:hi], self.k[lo:hi], self.ends[lo:hi], self.done[lo:hi],
                    self.after[lo:hi], batch, self.cum[lo:hi], int(self.offsets[e]), self.starts[lo:hi],
                    self.k_through[lo:hi])


def plan_many(requests: list[Request], exit_tokens: np.ndarray) -> list[Plan]:
    """`plan_flat` for engines given as Requests, one Plan each."""
    parts = [r.batch for r in requests] + [r.new for r in requests if r.new is not None]
    owner = list(range(len(requests))) + [e for e, r in enumerate(requests) if r.new is not None]
    eng = np.repeat(owner, [len(p) for p in parts])
    flat = plan_flat(eng, np.concatenate([p.sid for p in parts]), np.concatenate([p.finish for p in parts]),
                     np.concatenate([p.joined for p in parts]), np.array([r.progress for r in requests]),
                     np.array([r.context for r in requests], np.float64), np.array([r.t0 for r in requests]),
                     np.array([r.kv_tokens for r in requests], np.float64),
                     np.array([r.stop_at_completion for r in requests]), [r.decode for r in requests], exit_tokens)
    return [flat.plan(e, r.t0) for e, r in enumerate(requests)]


def _by_engine(eng: np.ndarray, fin: np.ndarray, sid: np.ndarray, progress: np.ndarray) -> np.ndarray:
    """The order of samples by (engine, finish, sid): one integer key when the three fit in 63 bits
    (an argsort of ints is many times faster than a lexsort), else a lexsort."""
    if not len(eng):
        return np.empty(0, np.int64)
    rel = fin - progress[eng]  # >= 0: a running sample finishes at or after its engine's progress
    sid_bits, rel_bits = int(sid.max()).bit_length(), int(rel.max()).bit_length()
    if rel.min() >= 0 and sid.min() >= 0 and sid_bits + rel_bits + int(eng.max()).bit_length() <= 62:
        key = (eng.astype(np.int64) << (sid_bits + rel_bits)) | (rel << sid_bits) | sid
        # keys are distinct (sample ids are): any sort gives this order. With room for the row
        # index below them, a sort of the keys (numpy's SIMD sort, a few times faster than
        # argsort) carries the permutation in its low bits
        idx_bits = (len(key) - 1).bit_length()
        if sid_bits + rel_bits + int(eng.max()).bit_length() + idx_bits <= 62:
            return np.sort((key << idx_bits) | np.arange(len(key))) & ((1 << idx_bits) - 1)
        return np.argsort(key)
    return np.lexsort((sid, fin, eng))


def plan_flat(eng: np.ndarray, sid: np.ndarray, fin: np.ndarray, joined: np.ndarray, progress: np.ndarray,
              context: np.ndarray, t0: np.ndarray, kv: np.ndarray, stop: np.ndarray, tables: list[DecodeTable],
              exit_tokens: np.ndarray) -> FlatPlans:
    """Jumps from completion to completion while each engine's KV cache holds.

    Engine e runs the samples with eng == e (in any order). An engine whose first jump would
    overflow its cache runs that jump alone, up to the overflow (the newest samples are preempted
    then); with `stop[e]` a plan ends at its first completion. Engines without samples get no
    jumps. Bit for bit what jumping one completion at a time gives: the same sums, in order.
    """
    n_eng = len(progress)
    sizes = np.bincount(eng, minlength=n_eng)
    order = _by_engine(eng, fin, sid, progress)
    eng, sid, fin, joined = eng[order], sid[order], fin[order], joined[order]
    je, b, s, k, done, freed, m = plan_jumps(eng, fin, exit_tokens[sid], sizes, progress, context, kv, stop)
    durations = _durations(tables, je, b, s, k)
    starts, ends, k_through = plan_clock(m, t0, durations, k)
    after = s + (b * k - freed)
    bounds = np.append(0, np.cumsum(m))
    cum = np.cumsum(done)
    offsets = np.append(0, cum)[bounds[:-1]]
    rows = np.append(0, np.cumsum(sizes))
    return FlatPlans(rows, sid, fin, joined, bounds, je, b, s, k, ends, starts, done, after, cum, offsets, k_through,
                     order)


def plan_first_jump(r: Request, exit_tokens: np.ndarray) -> Plan:
    """`plan_many` for one engine that stops at its first completion (it has decisions to take at
    every completion: samples wait for KV room, or new requests may come): one jump, compiled
    (sim.kernels.first_jump). The same arithmetic as `plan_many`, so the same bits."""
    d = r.decode
    sid, finish, joined, b, k, n, end, after = first_jump(
        r.batch.sid, r.batch.finish, r.batch.joined, r.progress, float(r.context), float(r.kv_tokens), exit_tokens,
        d.base_arr, d.slope_arr, d.ds, float(r.t0))
    # one array per dtype, one element per field (two small arrays instead of nine)
    i, f = np.array([b, k, n, n, k]), np.array([r.context, end, after, r.t0])
    return Plan(r.t0, i[0:1], f[0:1], i[1:2], f[1:2], i[2:3], f[2:3], Batch(sid, finish, joined), i[3:4], 0, f[3:4],
                i[4:5])


def _durations(tables: list[DecodeTable], je: np.ndarray, b: np.ndarray, s: np.ndarray, k: np.ndarray
               ) -> np.ndarray:
    """Seconds of each jump; tables[e] is engine e's table (or tables[0] every engine's)."""
    if all(t is tables[0] for t in tables):
        return tables[0].totals(b, s, k)
    out = np.empty(len(k))
    which = np.array([id(t) for t in tables])[je]
    for t in {id(t): t for t in tables}.values():
        sel = which == id(t)
        out[sel] = t.totals(b[sel], s[sel], k[sel])
    return out


@dataclass(slots=True)
class Cut:
    """Where an interrupted plan stops: after its first `jumps` jumps, then `iterations` of the next,
    which ends `rest` seconds from now."""

    jumps: int
    iterations: int
    rest: float


def cut_many(plans: list[tuple[Plan, DecodeTable]], now: float) -> list[Cut]:
    """Interrupted now: jumps that ended have happened; the one in progress stops after its current
    iteration (one that started this instant runs one iteration)."""
    js = [int(np.searchsorted(p.ends, now, "right")) for p, _ in plans]
    start = np.array([float(p.ends[j - 1]) if j else p.t0 for (p, _), j in zip(plans, js, strict=True)])
    b = np.array([p.b[j] for (p, _), j in zip(plans, js, strict=True)])
    s0 = np.array([p.s[j] for (p, _), j in zip(plans, js, strict=True)])
    k = np.array([p.k[j] for (p, _), j in zip(plans, js, strict=True)])
    done, rest = cut_jumps(b, s0, k, now - start, [t for _, t in plans])
    return [Cut(j, int(d), float(r)) for j, d, r in zip(js, done.tolist(), rest.tolist(), strict=True)]


def cut_jumps(b: np.ndarray, s0: np.ndarray, k: np.ndarray, elapsed: np.ndarray, tables: list[DecodeTable]
              ) -> tuple[np.ndarray, np.ndarray]:
    """Jumps in progress `elapsed` seconds after they started, stopped after their current
    iteration: (iterations run, seconds until then). tables[i] is jump i's table (or tables[0]
    every jump's, when it is the only one)."""
    done, rest = np.empty(len(k), np.int64), np.empty(len(k))
    if len(tables) == 1 or not len(k):
        return tables[0].stop_after(b, s0, k, elapsed) if len(k) else (done, rest)
    groups = {id(t): t for t in tables}
    which = np.array([id(t) for t in tables]) if len(groups) > 1 else None
    for key, table in groups.items():
        sel = np.flatnonzero(which == key) if which is not None else np.arange(len(k))
        done[sel], rest[sel] = table.stop_after(b[sel], s0[sel], k[sel], elapsed[sel])
    return done, rest
