"""Decode plans in closed form, for many engines at once.

An engine's running batch only changes at completions (and KV preemption), so until then its
future is arithmetic: with the samples sorted by the iteration at which they finish, jump j runs
b_j samples from one finishing point to the next, k_j iterations from total context s_j, and takes
DecodeTable.total(b_j, s_j, k_j) seconds. `decode_plans_of` lays out those jumps for every engine that
asks in the same instant as one set of numpy arrays (engines that load new weights together lay out
together), cut where an engine's KV cache would overflow or where it has a decision to take.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sim.decode_tables import DecodeStack, DecodeTable, stack_of
from sim.kernels.decode_plans import engine_keys, first_jump, plan_sorted
from sim.kernels.decode_sums import stop_one

EMPTY = np.empty(0, np.int64)  # no sample ids: the one empty index array admission, pools and parking share

@dataclass(slots=True)
class Batch:
    """Running samples. While a decode plan runs they are sorted by (finish, sid), so completions always
    leave from the front; samples joining are appended, and the next decode plan sorts them."""

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
class DecodePlan:
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
    part: int | None = None  # its completions' part in the completion pool, once filed

    def completed_before(self, j: int) -> int:
        return int(self.done_through[j - 1]) - self.done_offset if j else 0

    def ended(self, now: float) -> int:
        """Jumps ended by `now` (a first jump's one end compared, not searched: busy fleets ask at every completion)."""
        ends = self.ends
        return (1 if ends[0] <= now else 0) if len(ends) == 1 else int(ends.searchsorted(now, "right"))


@dataclass(slots=True)
class DecodeRequest:
    """One engine's batch and state when it lays out its decode plan (see sim.segment.prepare)."""

    batch: Batch
    progress: int
    context: float
    t0: float
    kv_tokens: float
    decode: DecodeTable
    stop_at_completion: bool  # it has a decision to take at its first completion
    new: Batch | None = None  # samples joining the batch (kept apart: the decode plan sorts them in)


@dataclass(slots=True)
class FlatDecodePlans:
    """The decode plans of many engines as one set of arrays (engine e owns rows[e]:rows[e+1] of the
    running samples, sorted by (finish, sid), and jumps[e]:jumps[e+1] of the jumps)."""

    rows: np.ndarray  # [E+1]
    sid: np.ndarray
    fin: np.ndarray
    joined: np.ndarray
    jumps: np.ndarray  # [E+1]
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
    n_done: np.ndarray  # [E]: samples each engine's decode plan completes (its first rows)
    order: np.ndarray  # rows[r] is input sample order[r]

    def of_engine(self, e: int, t0: float) -> DecodePlan:
        """Engine e's decode plan on its own."""
        lo, hi, r0, r1 = (int(x) for x in (self.jumps[e], self.jumps[e + 1], self.rows[e], self.rows[e + 1]))
        batch = Batch(self.sid[r0:r1], self.fin[r0:r1], self.joined[r0:r1])
        return DecodePlan(t0, self.b[lo:hi], self.s[lo:hi], self.k[lo:hi], self.ends[lo:hi], self.done[lo:hi],
                    self.after[lo:hi], batch, self.cum[lo:hi], int(self.offsets[e]), self.starts[lo:hi],
                    self.k_through[lo:hi])


def decode_plans_of(requests: list[DecodeRequest], exit_tokens: np.ndarray) -> list[DecodePlan]:
    """`flat_decode_plans` for engines given as Requests, one DecodePlan each."""
    parts = [r.batch for r in requests] + [r.new for r in requests if r.new is not None]
    owner = list(range(len(requests))) + [e for e, r in enumerate(requests) if r.new is not None]
    eng = np.repeat(owner, [len(p) for p in parts])
    stack, table = stack_of([r.decode for r in requests])
    flat = flat_decode_plans(eng, np.concatenate([p.sid for p in parts]), np.concatenate([p.finish for p in parts]),
                     np.concatenate([p.joined for p in parts]), np.array([r.progress for r in requests]),
                     np.array([r.context for r in requests], np.float64), np.array([r.t0 for r in requests]),
                     np.array([r.kv_tokens for r in requests], np.float64),
                     np.array([r.stop_at_completion for r in requests]), stack, table, exit_tokens)
    return [flat.of_engine(e, r.t0) for e, r in enumerate(requests)]


def _by_engine(eng: np.ndarray, fin: np.ndarray, sid: np.ndarray, progress: np.ndarray) -> np.ndarray:
    """The order of samples by (engine, finish, sid): a sort of packed integer keys (numpy's SIMD
    sort, many times faster than a lexsort) that carry the permutation in their low bits; a
    lexsort when the keys would not fit in 63 bits."""
    keys, idx_bits = engine_keys(eng, fin, sid, progress)
    if idx_bits < 0:
        return np.lexsort((sid, fin, eng))
    keys.sort()
    return keys & ((1 << idx_bits) - 1)


def flat_decode_plans(eng: np.ndarray, sid: np.ndarray, fin: np.ndarray, joined: np.ndarray, progress: np.ndarray,
              context: np.ndarray, t0: np.ndarray, kv: np.ndarray, stop: np.ndarray, stack: DecodeStack,
              table: np.ndarray, exit_tokens: np.ndarray) -> FlatDecodePlans:
    """Jumps from completion to completion while each engine's KV cache holds.

    Engine e runs the samples with eng == e (in any order), decoding on table[e] of the stack. An
    engine whose first jump would overflow its cache runs that jump alone, up to the overflow (the
    newest samples are preempted then); with `stop[e]` a decode plan ends at its first completion.
    Engines without samples get no jumps. Bit for bit what jumping one completion at a time gives:
    the same sums, in order (sim.kernels.decode_plans.plan_sorted).
    """
    eng = np.asarray(eng, np.int64)
    order = _by_engine(eng, fin, sid, progress)
    return FlatDecodePlans(*plan_sorted(order, eng, sid, fin, joined, exit_tokens, progress, context, kv,
                                  np.asarray(stop, np.bool_), t0, stack.base, stack.slope, stack.ds, table), order)


def first_jump_plan(r: DecodeRequest, exit_tokens: np.ndarray) -> DecodePlan:
    """`decode_plans_of` for one engine that stops at its first completion (it has decisions to take at
    every completion: samples wait for KV room, or new requests may come): one jump, compiled
    (sim.kernels.decode_plans.first_jump). The same arithmetic as `decode_plans_of`, so the same bits."""
    d, batch = r.decode, r.batch
    # one array per dtype, one element per field (two small arrays instead of nine), filled by the kernel
    rows, i, f = np.empty((3, len(batch.sid)), np.int64), np.empty(5, np.int64), np.empty(4)
    first_jump(batch.sid, batch.finish, batch.joined, r.progress, float(r.context), float(r.kv_tokens), exit_tokens,
               d.base_arr, d.slope_arr, d.ds, float(r.t0), rows, i, f)
    return DecodePlan(r.t0, i[0:1], f[0:1], i[1:2], f[1:2], i[2:3], f[2:3], Batch(rows[0], rows[1], rows[2]), i[3:4],
                      0, f[3:4], i[4:5])


@dataclass(slots=True)
class DecodeCut:
    """Where an interrupted decode plan stops: after its first `jumps` jumps, then `iterations` of the next,
    which ends `rest` seconds from now."""

    jumps: int
    iterations: int
    rest: float


def cut_one(plan: DecodePlan, table: DecodeTable, now: float) -> DecodeCut:
    """`cuts_of` for one decode plan: the same kernel (stop_one is what stop_after runs per jump),
    on plain numbers instead of arrays of one."""
    j = plan.ended(now)
    start = float(plan.ends[j - 1]) if j else plan.t0
    done, rest = stop_one(table.base_arr, table.slope_arr, table.ds, int(plan.b[j]), float(plan.s[j]), int(plan.k[j]),
                          now - start)
    return DecodeCut(j, int(done), float(rest))


def cuts_of(plans: list[tuple[DecodePlan, DecodeTable]], now: float) -> list[DecodeCut]:
    """Interrupted now: jumps that ended have happened; the one in progress stops after its current
    iteration (one that started this instant runs one iteration)."""
    js = [int(p.ends.searchsorted(now, "right")) for p, _ in plans]
    start = np.array([float(p.ends[j - 1]) if j else p.t0 for (p, _), j in zip(plans, js, strict=True)])
    b = np.array([p.b[j] for (p, _), j in zip(plans, js, strict=True)])
    s0 = np.array([p.s[j] for (p, _), j in zip(plans, js, strict=True)])
    k = np.array([p.k[j] for (p, _), j in zip(plans, js, strict=True)])
    stack, table = stack_of([t for _, t in plans])
    done, rest = stack.stop_after(table, b, s0, k, now - start)
    return [DecodeCut(j, int(d), float(r)) for j, d, r in zip(js, done.tolist(), rest.tolist(), strict=True)]
