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


def plan_many(requests: list[Request], exit_tokens: np.ndarray) -> list[Plan]:
    """Jumps from completion to completion while each engine's KV cache holds.

    An engine whose first jump would overflow its cache runs that jump alone, up to the overflow
    (the newest samples are preempted then); with `stop_at_completion` a plan ends at its first
    completion. Bit for bit what jumping one completion at a time gives: the same sums, in order.
    """
    n_eng = len(requests)
    parts = [r.batch for r in requests] + [r.new for r in requests if r.new is not None]
    owner = list(range(n_eng)) + [e for e, r in enumerate(requests) if r.new is not None]
    eng = np.repeat(owner, [len(p) for p in parts])
    sizes = np.bincount(eng, minlength=n_eng)
    sid = np.concatenate([p.sid for p in parts])
    fin = np.concatenate([p.finish for p in parts])
    order = np.lexsort((sid, fin, eng))  # each engine's samples by (finish, sid)
    eng, sid, fin = eng[order], sid[order], fin[order]
    joined = np.concatenate([p.joined for p in parts])[order]
    # jumps: one per distinct finishing point of each engine
    new = np.ones(len(fin), bool)
    new[1:] = (eng[1:] != eng[:-1]) | (fin[1:] != fin[:-1])
    first = np.flatnonzero(new)
    je = eng[first]
    done = np.diff(np.append(first, len(fin)))
    freed = np.add.reduceat(exit_tokens[sid], first)
    first_jump = np.searchsorted(je, np.arange(n_eng))  # each engine's first jump
    count = np.diff(np.append(first_jump, len(je)))
    rank = np.arange(len(je)) - first_jump[je]
    gone = np.cumsum(done) - done  # completed before this jump, counted across engines
    b = sizes[je] - (gone - gone[first_jump][je])
    progress = np.array([r.progress for r in requests])
    prev = np.empty_like(fin[first])
    prev[1:] = fin[first][:-1]
    prev[first_jump] = progress
    k = fin[first] - prev
    grow = b * k - freed
    grown = np.cumsum(grow) - grow
    context = np.array([r.context for r in requests])
    s = context[je] + (grown - grown[first_jump][je]).astype(np.float64)  # integers: exact either way
    kv = np.array([r.kv_tokens for r in requests])
    room = np.floor_divide(kv[je] - s, b)
    # each engine's plan ends before its first jump that would overflow, or after its first
    # completion if it must decide then
    m = np.minimum.reduceat(np.where(room >= k, count[je], rank), first_jump)
    stop = np.array([r.stop_at_completion for r in requests])
    m = np.where(stop, np.minimum(m, 1), m)
    for e in np.flatnonzero(m == 0):  # the first jump overflows: run it up to the overflow alone
        j, r = first_jump[e], int(room[first_jump[e]])
        k0 = max(1, min(int(k[j]), r)) if r >= 1 else 1
        if k0 != k[j]:
            done[j] = freed[j] = 0
        k[j], m[e] = k0, 1
    keep = rank < m[je]
    b, s, k, done, freed, je, rank = b[keep], s[keep], k[keep], done[keep], freed[keep], je[keep], rank[keep]
    durations = _durations(requests, je, b, s, k)
    # each engine's clock: sequential sums from its t0, as chained timeouts would give
    clock = np.zeros((n_eng, int(m.max()) + 1))
    clock[:, 0] = [r.t0 for r in requests]
    clock[je, rank + 1] = durations
    clock = np.cumsum(clock, axis=1)
    starts, ends = clock[je, rank], clock[je, rank + 1]
    after = s + (b * k - freed)
    bounds = np.append(0, np.cumsum(m)).tolist()
    rows = np.append(0, np.cumsum(sizes)).tolist()
    cum = np.cumsum(done)
    offsets = (cum - done)[bounds[:-1]].tolist()
    ck = np.cumsum(k)
    k_through = ck - (ck - k)[np.repeat(bounds[:-1], m)]  # integers: exact
    plans = []
    for e, r in enumerate(requests):
        lo, hi, r0, r1 = bounds[e], bounds[e + 1], rows[e], rows[e + 1]
        batch = Batch(sid[r0:r1], fin[r0:r1], joined[r0:r1])
        plans.append(Plan(r.t0, b[lo:hi], s[lo:hi], k[lo:hi], ends[lo:hi], done[lo:hi], after[lo:hi], batch,
                          cum[lo:hi], offsets[e], starts[lo:hi], k_through[lo:hi]))
    return plans


def plan_first_jump(r: Request, exit_tokens: np.ndarray) -> Plan:
    """`plan_many` for one engine that stops at its first completion (it has decisions to take at
    every completion: samples wait for KV room, or new requests may come): one jump, in scalars.
    The same arithmetic as `plan_many`, so the same bits."""
    order = np.lexsort((r.batch.sid, r.batch.finish))
    batch = r.batch.without(order)
    first = int(batch.finish[0])
    n = int(np.searchsorted(batch.finish, first, "right"))
    b, k, s0 = len(batch), first - r.progress, r.context
    room = (r.kv_tokens - s0) // b
    freed = int(exit_tokens[batch.sid[:n]].sum())
    if room < k:  # the cache overflows first: stop there
        k0 = max(1, min(k, int(room))) if room >= 1 else 1
        n, freed, k = (n, freed, k) if k0 == k else (0, 0, k0)
    end = r.t0 + r.decode.total(b, s0, k)
    return Plan(r.t0, np.array([b]), np.array([s0]), np.array([k]), np.array([end]), np.array([n]),
                np.array([s0 + (b * k - freed)]), batch, np.array([n]), 0, np.array([r.t0]), np.array([k]))


def _durations(requests: list[Request], je: np.ndarray, b: np.ndarray, s: np.ndarray, k: np.ndarray) -> np.ndarray:
    tables = [r.decode for r in requests]
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
    elapsed = now - start
    done, rest = np.empty(len(plans), np.int64), np.empty(len(plans))
    tables = {id(t): t for _, t in plans}
    which = np.array([id(t) for _, t in plans])
    for key, table in tables.items():
        sel = np.flatnonzero(which == key)
        bb, ss, kk, el = b[sel], s0[sel], k[sel], elapsed[sel]
        d = table.iterations_within(bb, ss, kk, el)
        d = np.where((d == 0) | (table.totals(bb, ss, d) < el - 1e-12), d + 1, d)
        d = np.minimum(kk, d)
        done[sel], rest[sel] = d, table.totals(bb, ss, d) - el
    return [Cut(j, int(d), float(r)) for j, d, r in zip(js, done.tolist(), rest.tolist(), strict=True)]
