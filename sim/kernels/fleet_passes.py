"""The fleet's passes over parked and loading engines at a weight push: which stop, what their rows
become, what they admit, which prefills have ended (sim.fleet_parking)."""

from __future__ import annotations

import numpy as np
from numba import njit

from sim.kernels.decode_sums import stop_one
from sim.kernels.owners import counts_by_owner


@njit(cache=True)
def stop_parked(jumps: np.ndarray, ends: np.ndarray, b: np.ndarray, s: np.ndarray, k: np.ndarray, done: np.ndarray,
                alive: np.ndarray, t0: np.ndarray, rest: np.ndarray, idle_end: np.ndarray, interruptible: np.ndarray,
                kv: np.ndarray, table: np.ndarray, base: np.ndarray, slope: np.ndarray, ds: np.ndarray, now: float,
                ready_at: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                          np.ndarray, np.ndarray, np.ndarray]:
    """sim.parking.Parking's stop decision for the engines of one sim.engine_groups.Parked at a push: which
    stop now (`ok`: parked, decoding, nothing left in the inbox; an ended decode plan only if the engine
    is idle after it, one in progress only if interruptible, the iteration in progress ends
    before the weights are in, and it does not overflow the cache), and after how many whole
    jumps (`jcount`). For those cutting a jump: the engine, the jump, when it started, b running,
    iterations run, when the iteration in progress ends, and the completions it makes (its jump's
    if those iterations end it, else 0)."""
    n = len(alive)
    ok = np.zeros(n, np.bool_)
    jcount = np.zeros(n, np.int64)
    cutting, at, cut_b, cut_d, finishing = (np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int64),
                                            np.empty(n, np.int64), np.empty(n, np.int64))
    start, stop_at = np.empty(n), np.empty(n)
    m = 0
    for e in range(n):
        lo, hi = jumps[e], jumps[e + 1]
        ended = hi == lo or ends[hi - 1] <= now
        if not (alive[e] and now >= t0[e] and rest[e] == 0 and (idle_end[e] if ended else interruptible[e])):
            continue
        if ended:
            ok[e], jcount[e] = True, hi - lo
            continue
        j = np.searchsorted(ends[lo:hi], now, "right")
        a = lo + j  # the jump in progress
        begin = ends[a - 1] if j > 0 else t0[e]
        t = table[e]
        d, left = stop_one(base[t], slope[t], ds[t], b[a], s[a], k[a], now - begin)
        end = now + left if left > 0 else now  # as `if rest > 0: yield timeout(rest)` leaves the clock
        # one still decoding when the weights are in loads on its own, and one that overflows preempts
        if not (ready_at > end and s[a] + b[a] * d <= kv[e]):
            continue
        ok[e], jcount[e] = True, j
        cutting[m], at[m], start[m], cut_b[m], cut_d[m], stop_at[m] = e, a, begin, b[a], d, end
        finishing[m] = done[a] if d == k[a] else 0
        m += 1
    return ok, jcount, cutting[:m], at[:m], start[:m], cut_b[:m], cut_d[:m], stop_at[:m], finishing[:m]


@njit(cache=True)
def stop_rows(chosen: np.ndarray, jcount: np.ndarray, progress0: np.ndarray, context0: np.ndarray,
              jumps: np.ndarray, k_through: np.ndarray, after: np.ndarray, cum: np.ndarray, offsets: np.ndarray,
              rows: np.ndarray, sid: np.ndarray, exit_tokens: np.ndarray, cut_b: np.ndarray, cut_d: np.ndarray,
              finishing: np.ndarray, engines: np.ndarray, version: np.ndarray, starts: np.ndarray, ends: np.ndarray,
              b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                      np.ndarray, np.ndarray, np.ndarray]:
    """sim.parking.Parking's stop bookkeeping for parked engines stopped at a push (chosen),
    each after its first jcount jumps and, where it was cutting a jump, cut_d more iterations of
    it (cut_b running; finishing: the jump's completions when those iterations end it, else 0).

    Returns per engine its progress, KV context and the samples its ended jumps completed; per
    row of the decode plans its fate: 0 it decodes on after the load (or its engine did not stop), 1
    completed by an ended jump, 2 completed by the iteration in progress (in at that iteration's
    end, which frees its KV); and the ended jumps for the timeline (fleet index of the engine,
    start, end, the engine's version, samples running). Completed rows are a prefix of each
    engine's rows, sorted as they are by finish."""
    n = len(chosen)
    progress, context = progress0.copy(), context0.copy()
    n_done = np.zeros(n, np.int64)
    fate = np.zeros(len(sid), np.int8)
    n_ended = 0
    for e in range(n):
        if chosen[e]:
            n_ended += jcount[e]
    d_engine, d_version, d_b = np.empty(n_ended, np.int64), np.empty(n_ended, np.int64), np.empty(n_ended, np.int64)
    d_start, d_end = np.empty(n_ended), np.empty(n_ended)
    q = 0
    for e in range(n):
        if not chosen[e]:
            continue
        if jcount[e] > 0:
            last = jumps[e] + jcount[e] - 1
            for j in range(jumps[e], last + 1):
                d_engine[q], d_version[q], d_b[q] = engines[e], version[e], b[j]
                d_start[q], d_end[q] = starts[j], ends[j]
                q += 1
            progress[e] += k_through[last]
            context[e] = after[last]
            n_done[e] = cum[last] - offsets[e]
        progress[e] += cut_d[e]
        context[e] += cut_b[e] * cut_d[e]
        r0 = rows[e]
        fate[r0:r0 + n_done[e]] = 1
        freed = 0
        for r in range(r0 + n_done[e], r0 + n_done[e] + finishing[e]):
            fate[r] = 2
            freed += exit_tokens[sid[r]]
        if finishing[e]:
            context[e] -= float(freed)  # integers below 2^53: the sum is exact
    return progress, context, n_done, fate, d_engine, d_start, d_end, d_version, d_b


@njit(cache=True)
def admit_rows(owner: np.ndarray, sid: np.ndarray, fin: np.ndarray, joined: np.ndarray, in_owner: np.ndarray,
               in_sid: np.ndarray, take: np.ndarray, progress: np.ndarray, prompt: np.ndarray, response: np.ndarray,
               n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                np.ndarray, np.ndarray]:
    """sim.parking.Parking's admission for n engines: the running rows (owner, sid, fin, joined)
    and, after them, the inbox entries taken (joining at the engine's progress). Returns per engine
    the samples running, admitted and left in the inbox, and the prompt tokens admitted; and the
    rows (owner, sid, finish, joined) with a flag for the admitted ones."""
    running = counts_by_owner(owner, n)
    head = np.zeros(n, np.int64)
    rest = np.zeros(n, np.int64)
    tokens = np.zeros(n)
    m = len(owner)
    for q in range(len(in_sid)):
        if take[q]:
            head[in_owner[q]] += 1
        else:
            rest[in_owner[q]] += 1
    total = m + head.sum()
    all_owner, all_sid = np.empty(total, np.int64), np.empty(total, np.int64)
    all_fin, all_joined = np.empty(total, np.int64), np.empty(total, np.int64)
    is_new = np.zeros(total, np.bool_)
    all_owner[:m], all_sid[:m], all_fin[:m], all_joined[:m] = owner, sid, fin, joined
    r = m
    for q in range(len(in_sid)):
        if take[q]:
            e, s = in_owner[q], in_sid[q]
            tokens[e] += prompt[s]  # integers below 2^53: exact, as a bincount's float sum
            all_owner[r], all_sid[r] = e, s
            all_fin[r], all_joined[r] = progress[e] + response[s], progress[e]
            is_new[r] = True
            r += 1
    return running, head, rest, tokens, all_owner, all_sid, all_fin, all_joined, is_new


@njit(cache=True)
def admissible(free: np.ndarray, owner: np.ndarray, context: np.ndarray, in_owner: np.ndarray, in_sid: np.ndarray,
               max_batch: np.ndarray, room: np.ndarray, prompt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """sim.parking.Parking's admission check: which engines (free ones, running rows `owner`) admit the head
    of their inbox (in_owner grouped by engine, in order) whole, and which entries those heads are.
    The head is what the batch has slots for; each must fit in the KV cache's room on top of the
    engine's context, except the first of an empty engine, which is always taken."""
    running = counts_by_owner(owner, len(free))
    ok = free.copy()
    take = np.zeros(len(in_sid), np.bool_)
    q = 0
    while q < len(in_sid):
        e, start = in_owner[q], q
        while q < len(in_sid) and in_owner[q] == e:
            q += 1
        head = min(q - start, max(0, max_batch[e] - running[e]))
        for t in range(start, start + head):
            take[t] = True
            if not (t == start and running[e] == 0) and not context[e] + prompt[in_sid[t]] + 1 <= room[e]:
                ok[e] = False
    return ok, take


@njit(cache=True)
def split_stopped(chosen: np.ndarray, fate: np.ndarray, n_done: np.ndarray, rows: np.ndarray, sid: np.ndarray,
                  fin: np.ndarray, joined: np.ndarray, version: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                             np.ndarray, np.ndarray, np.ndarray]:
    """The rows of engines stopped at a push (`stop_rows`' fates), split: the completed ones' tokens
    to credit (sample, engine's version, tokens since it joined); those completed by the iteration
    in progress (engine, rank among what its decode plan completes); and those that decode on, with their
    engine renumbered among the stopped ones, and how many each keeps."""
    n = len(chosen)
    n_gone = n_late = n_stay = 0
    for e in range(n):
        if chosen[e]:
            for r in range(rows[e], rows[e + 1]):
                if fate[r] > 0:
                    n_gone += 1
                    n_late += fate[r] == 2
                else:
                    n_stay += 1
    gone_sid, gone_version, gone_tokens = np.empty(n_gone, np.int64), np.empty(n_gone, np.int64), np.empty(
        n_gone, np.int64)
    late_owner, late_rank = np.empty(n_late, np.int64), np.empty(n_late, np.int64)
    stay_owner, stay_sid = np.empty(n_stay, np.int64), np.empty(n_stay, np.int64)
    stay_fin, stay_joined = np.empty(n_stay, np.int64), np.empty(n_stay, np.int64)
    stay_count = np.zeros(chosen.sum(), np.int64)
    g = q = s = slot = 0
    for e in range(n):
        if not chosen[e]:
            continue
        for r in range(rows[e], rows[e + 1]):
            if fate[r] > 0:
                gone_sid[g], gone_version[g], gone_tokens[g] = sid[r], version[e], fin[r] - joined[r]
                g += 1
                if fate[r] == 2:
                    late_owner[q], late_rank[q] = e, r - rows[e] - n_done[e]
                    q += 1
            else:
                stay_owner[s], stay_sid[s], stay_fin[s], stay_joined[s] = slot, sid[r], fin[r], joined[r]
                stay_count[slot] += 1
                s += 1
        slot += 1
    return (gone_sid, gone_version, gone_tokens, late_owner, late_rank, stay_owner, stay_sid, stay_fin, stay_joined,
            stay_count)


@njit(cache=True)
def reload_rows(owner: np.ndarray, sid: np.ndarray, joined: np.ndarray, progress: np.ndarray, version: np.ndarray,
                generated: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """sim.parking.Parking.load_group's pass over the running rows of engines that load new weights:
    each sample's tokens since it joined were made by its engine's old version (returned, with
    that version, for Samples.credit), count as generated (their KV is recomputed), and it joins
    again at its engine's progress (`joined` updated in place, as `generated`)."""
    tokens, old = np.empty(len(sid), np.int64), np.empty(len(sid), np.int64)
    for r in range(len(sid)):
        e = owner[r]
        tokens[r] = progress[e] - joined[r]
        old[r] = version[e]
        generated[sid[r]] += tokens[r]
        joined[r] = progress[e]
    return tokens, old


@njit(cache=True)
def phases_done(which: np.ndarray, phases_open: np.ndarray, t0: np.ndarray, reprefill_end: np.ndarray,
                prefill_end: np.ndarray, seg_start: np.ndarray, engines: np.ndarray, version: np.ndarray,
                n_pre: np.ndarray, n_new: np.ndarray, now: float, final: bool
                ) -> tuple[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray],
                           tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """sim.parking.Parking's record of the phases for parked engines `which` (local indices): the re-prefills,
    then the prefills, that have ended by `now` among engines whose phases are still open and that
    decode by now (or all of them, `final`), as timeline rows (fleet index, start, end, version,
    samples); an engine with nothing left to end is closed (phases_open updated in place)."""
    keep = np.zeros(len(which), np.bool_)
    n_re = n_pre_rows = 0
    for q in range(len(which)):
        i = which[q]
        if phases_open[i] and (final or now >= t0[i]):
            keep[q] = True
            n_re += reprefill_end[i] <= now
            n_pre_rows += prefill_end[i] <= now
    re = (np.empty(n_re, np.int64), np.empty(n_re), np.empty(n_re), np.empty(n_re, np.int64),
          np.empty(n_re, np.int64))
    pre = (np.empty(n_pre_rows, np.int64), np.empty(n_pre_rows), np.empty(n_pre_rows), np.empty(n_pre_rows, np.int64),
           np.empty(n_pre_rows, np.int64))
    a = c = 0
    for q in range(len(which)):
        if not keep[q]:
            continue
        i = which[q]
        if reprefill_end[i] <= now:
            re[0][a], re[3][a], re[4][a] = engines[i], version[i], n_pre[i]
            re[1][a], re[2][a] = seg_start[i], reprefill_end[i]
            a += 1
        if prefill_end[i] <= now:
            pre[0][c], pre[3][c], pre[4][c] = engines[i], version[i], n_new[i]
            pre[1][c] = seg_start[i] if np.isnan(reprefill_end[i]) else reprefill_end[i]  # after the re-prefill
            pre[2][c] = prefill_end[i]
            c += 1
        if not reprefill_end[i] > now and not prefill_end[i] > now:
            phases_open[i] = False
    return re, pre
