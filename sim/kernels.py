"""The simulator's inner loops, compiled with numba.

At every weight push the fleet stops, reloads and replans every engine together: passes over all
samples in flight (tens of thousands at 1024 GPUs). As numpy expressions each such pass costs one
trip over memory per operation; here each is one loop. Floating-point arithmetic keeps the order
of the formulas it replaced and numba's default strict IEEE mode (no fastmath: no reassociation,
no fused multiply-adds), so results are the same bits (bench/sim_compare.py checks a change
against an older tree). Kernels compile on first use and are cached beside this file (about ten
seconds once per install).

  decode sums    jump_total(s), stop_after       (sim.costs.DecodeTable, DecodeStack)
  prefill        prefill_one, prefill_many       (sim.costs.PrefillCurve)
  planning       engine_keys, plan_sorted        (sim.planning.plan_flat)
  fleet passes   admissible, admit_rows, stop_parked, stop_rows, phases_done,
                 split_stopped                   (sim.engine.Fleet)
  weight loads   group_by_owner (sim.bulk.Loading), reload_rows (sim.engine.Fleet._load_group)
  completions    file_entries, file_plans, take_due, compact_pool  (sim.pending.Pending)
  one engine     first_jump                      (sim.planning.plan_first_jump)
  routing        route_few, water_fill_kernel    (sim.controller)
  staleness      tally_lags                      (sim.samples.Samples.staleness_tokens)
  busy time      add_busy                        (sim.recorder.Recorder)
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit


@njit(cache=True)
def jump_total(base: np.ndarray, slope: np.ndarray, ds: float, b: int, s0: float, k: int) -> float:
    """sim.costs.DecodeTable.total on the table's arrays: sum_{j<k} t(b, s0 + b j), cell by cell
    of the context grid (linear within a cell: an arithmetic series)."""
    if k <= 0:
        return 0.0
    last = base.shape[1] - 1  # the last cell extends to infinity
    out = 0.0
    j = 0
    while j < k:
        c = int((s0 + b * j) / ds)
        if c >= last:
            c = last
            j_end = k
        else:
            c = max(c, 0)
            j_end = min(k, max(j + 1, math.ceil(((c + 1) * ds - s0) / b)))
        n = j_end - j
        sl = slope[b, c]
        out += n * (base[b, c] + sl * s0) + sl * b * (j + j_end - 1) * n / 2
        j = j_end
    return out


@njit(cache=True)
def jump_totals(base: np.ndarray, slope: np.ndarray, ds: float, b: np.ndarray, s0: np.ndarray, k: np.ndarray
                ) -> np.ndarray:
    """`jump_total` of every jump."""
    out = np.empty(len(k))
    for i in range(len(k)):
        out[i] = jump_total(base, slope, ds, b[i], s0[i], k[i])
    return out


@njit(cache=True)
def _counts(owner: np.ndarray, n: int) -> np.ndarray:
    """How many entries each of n owners has."""
    out = np.zeros(n, np.int64)
    for i in range(len(owner)):
        out[owner[i]] += 1
    return out


@njit(cache=True)
def _bounds(owner: np.ndarray, n: int) -> np.ndarray:
    """Where each of n owners' entries start once grouped by owner, then their total: [n + 1]."""
    out = np.zeros(n + 1, np.int64)
    out[1:] = np.cumsum(_counts(owner, n))
    return out


@njit(cache=True)
def _bit_length(x: int) -> int:
    n = 0
    while x > 0:
        x >>= 1
        n += 1
    return n


@njit(cache=True)
def engine_keys(eng: np.ndarray, fin: np.ndarray, sid: np.ndarray, progress: np.ndarray) -> tuple[np.ndarray, int]:
    """Sort keys for sim.planning.plan_flat's order by (engine, finish, sid): per row the three
    packed in one integer (finish relative to its engine's progress), with the row's index in the
    low `bits` bits. Keys are distinct (sample ids are), so any sort of them gives that order and
    carries the permutation. bits = -1: they do not fit in 63 bits (the caller lexsorts)."""
    n = len(eng)
    sid_max = rel_max = eng_max = 0
    negative = False
    for r in range(n):
        rel = fin[r] - progress[eng[r]]  # >= 0: a running sample finishes at or after its engine's progress
        negative |= rel < 0 or sid[r] < 0
        sid_max, rel_max, eng_max = max(sid_max, sid[r]), max(rel_max, rel), max(eng_max, eng[r])
    sid_bits, rel_bits = _bit_length(sid_max), _bit_length(rel_max)
    idx_bits = _bit_length(n - 1)
    keys = np.empty(n, np.int64)
    if negative or sid_bits + rel_bits + _bit_length(eng_max) + idx_bits > 62:
        return keys, -1
    for r in range(n):
        rel = fin[r] - progress[eng[r]]
        keys[r] = (((eng[r] << rel_bits | rel) << sid_bits | sid[r]) << idx_bits) | r
    return keys, idx_bits


@njit(cache=True)
def plan_sorted(order: np.ndarray, eng: np.ndarray, sid: np.ndarray, fin: np.ndarray, joined: np.ndarray,
                exit_tokens: np.ndarray, progress: np.ndarray, context: np.ndarray, kv: np.ndarray, stop: np.ndarray,
                t0: np.ndarray, base: np.ndarray, slope: np.ndarray, ds: np.ndarray, table: np.ndarray
                ) -> tuple[np.ndarray, ...]:
    """sim.planning.plan_flat once its rows' order by (engine, finish, sid) is known: the rows in
    that order, and each engine's jumps, one per distinct finishing point, b running for k
    iterations from total context s, kept while the KV cache holds (only the first when the engine
    stops at its first completion; a first jump that overflows runs alone up to the overflow).
    Each jump's seconds are `jump_total` on its engine's table (base[t], slope[t], ds[t] with
    t = table[engine]), and its clock a sequential sum from the engine's t0, as chained timeouts
    would give. Returns the fields of sim.planning.FlatPlans, in its order, but `order`."""
    n_rows, n_eng = len(order), len(progress)
    rows = _bounds(eng, n_eng)
    o_sid, o_fin, o_joined = np.empty(n_rows, np.int64), np.empty(n_rows, np.int64), np.empty(n_rows, np.int64)
    for r in range(n_rows):
        q = order[r]
        o_sid[r], o_fin[r], o_joined[r] = sid[q], fin[q], joined[q]
    jumps = np.zeros(n_eng + 1, np.int64)
    b, k, done = np.empty(n_rows, np.int64), np.empty(n_rows, np.int64), np.empty(n_rows, np.int64)
    s, ends, starts, after = np.empty(n_rows), np.empty(n_rows), np.empty(n_rows), np.empty(n_rows)
    cum, k_through = np.empty(n_rows, np.int64), np.empty(n_rows, np.int64)
    offsets = np.empty(n_eng, np.int64)
    n = 0  # kept jumps so far
    completed = 0  # samples completed by them
    for e in range(n_eng):
        offsets[e] = completed
        r, end = rows[e], rows[e + 1]
        left, grown, prev, rank, overflowed = end - r, 0, progress[e], 0, False
        iterations = 0
        while r < end and not overflowed and not (stop[e] and rank == 1):
            f = o_fin[r]
            q, fr = r, 0
            while q < end and o_fin[q] == f:
                fr += exit_tokens[o_sid[q]]
                q += 1
            kk = f - prev
            ss = context[e] + float(grown)  # integers below 2^53: exact
            if not kv[e] - ss >= left * kk:  # the cache would overflow during this jump
                if rank > 0:
                    break
                room = (kv[e] - ss) // left  # iterations the cache still holds
                k0 = max(1, min(kk, int(room))) if room >= 1 else 1
                if k0 != kk:
                    q, fr = r, 0  # it stops before its completions
                kk, overflowed = k0, True
            b[n], s[n], k[n], done[n] = left, ss, kk, q - r
            after[n] = ss + (left * kk - fr)
            iterations += kk
            k_through[n] = iterations
            completed += q - r
            cum[n] = completed
            n += 1
            grown += left * kk - fr
            left -= q - r
            prev, rank, r = f, rank + 1, q
        jumps[e + 1] = n
    # the clocks in a pass of their own (the loop above is long enough as it is: compiled into it,
    # the sums ran half as fast)
    n_done = np.zeros(n_eng, np.int64)
    for e in range(n_eng):
        t = table[e]
        base_t, slope_t, ds_t = base[t], slope[t], ds[t]
        clock = t0[e]
        for j in range(jumps[e], jumps[e + 1]):
            starts[j] = clock
            clock = clock + jump_total(base_t, slope_t, ds_t, b[j], s[j], k[j])
            ends[j] = clock
        n_done[e] = (cum[jumps[e + 1] - 1] if jumps[e + 1] > jumps[e] else offsets[e]) - offsets[e]
    return (rows, o_sid, o_fin, o_joined, jumps, b[:n], s[:n], k[:n], ends[:n], starts[:n], done[:n], after[:n],
            cum[:n], offsets, k_through[:n], n_done)


@njit(cache=True)
def prefill_one(log_tokens: np.ndarray, log_seconds: np.ndarray, tokens: float) -> float:
    """sim.costs.PrefillCurve: seconds to prefill `tokens`, interpolated on the log-log grid
    (np.interp's formula, numpy's compiled_base.c, flat beyond the ends)."""
    if tokens <= 0:
        return 0.0
    x = math.log(tokens)
    if x >= log_tokens[-1]:
        return math.exp(log_seconds[-1])
    if x <= log_tokens[0]:
        return math.exp(log_seconds[0])
    j = np.searchsorted(log_tokens, x, "right") - 1
    if log_tokens[j] == x:
        return math.exp(log_seconds[j])
    slope = (log_seconds[j + 1] - log_seconds[j]) / (log_tokens[j + 1] - log_tokens[j])
    return math.exp(slope * (x - log_tokens[j]) + log_seconds[j])


@njit(cache=True)
def prefill_many(log_tokens: np.ndarray, log_seconds: np.ndarray, tokens: np.ndarray) -> np.ndarray:
    """`prefill_one` of every count."""
    out = np.empty(len(tokens))
    for i in range(len(tokens)):
        out[i] = prefill_one(log_tokens, log_seconds, tokens[i])
    return out


@njit(cache=True)
def _iterations_within(base: np.ndarray, slope: np.ndarray, ds: float, b: int, s0: float, k: int, seconds: float
                       ) -> int:
    """The largest count w <= k of iterations whose sum fits in `seconds` (to 1e-12): guessed from
    the first grid cell's arithmetic series (a quadratic in w), then the guess's neighbours are
    checked, then a bisection if the jump crossed cells. Sums grow with w, so the answer is the
    same whatever the guess."""
    limit = seconds + 1e-12
    c = min(max(int(s0 / ds), 0), base.shape[1] - 1)
    per = base[b, c] + slope[b, c] * s0  # the first iteration's seconds
    a = slope[b, c] * b / 2
    guess = seconds / per if per > 0 else 0.0
    if a > 0:
        guess = (math.sqrt((per - a) ** 2 + 4 * a * seconds) - (per - a)) / (2 * a)
    w = int(min(max(math.floor(guess), 0), k)) if math.isfinite(guess) else 0
    lo, hi = 0, k  # the answer lies in [lo, hi]
    for _ in range(2):  # the guess and its neighbours first
        if jump_total(base, slope, ds, b, s0, w) <= limit:
            lo = w
            if w == k or jump_total(base, slope, ds, b, s0, w + 1) > limit:
                return w
            w += 1
        else:
            hi = w - 1
            w -= 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if jump_total(base, slope, ds, b, s0, mid) <= limit:
            lo = mid
        else:
            hi = mid - 1
    return lo


@njit(cache=True)
def _stop_one(base: np.ndarray, slope: np.ndarray, ds: float, b: int, s0: float, k: int, elapsed: float
              ) -> tuple[int, float]:
    """A jump in progress `elapsed` seconds after it started, stopped after its current iteration
    (one that started at `elapsed` runs one iteration): (iterations run, seconds left until then)."""
    within = _iterations_within(base, slope, ds, b, s0, k, elapsed)
    d = within
    if within == 0 or jump_total(base, slope, ds, b, s0, within) < elapsed - 1e-12:
        d = within + 1  # the iteration in progress runs to its end
    d = min(k, d)
    return d, jump_total(base, slope, ds, b, s0, d) - elapsed


@njit(cache=True)
def stop_after(base: np.ndarray, slope: np.ndarray, ds: np.ndarray, table: np.ndarray, b: np.ndarray, s0: np.ndarray,
               k: np.ndarray, elapsed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """sim.costs.DecodeTable.stop_after (`_stop_one` of every jump). Jump i's table is t = table[i]
    of a stack (base[t], slope[t], ds[t]; sim.costs.DecodeStack)."""
    n = len(k)
    done, rest = np.empty(n, np.int64), np.empty(n)
    for i in range(n):
        t = table[i]
        done[i], rest[i] = _stop_one(base[t], slope[t], ds[t], b[i], s0[i], k[i], elapsed[i])
    return done, rest


@njit(cache=True)
def stop_parked(jumps: np.ndarray, ends: np.ndarray, b: np.ndarray, s: np.ndarray, k: np.ndarray, done: np.ndarray,
                alive: np.ndarray, t0: np.ndarray, rest: np.ndarray, idle_end: np.ndarray, interruptible: np.ndarray,
                kv: np.ndarray, table: np.ndarray, base: np.ndarray, slope: np.ndarray, ds: np.ndarray, now: float,
                ready_at: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                          np.ndarray, np.ndarray, np.ndarray]:
    """sim.engine.Fleet._stop's decision for the engines of one sim.bulk.Parked at a push: which
    stop now (`ok`: parked, decoding, nothing left in the inbox; an ended plan only if the engine
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
        d, left = _stop_one(base[t], slope[t], ds[t], b[a], s[a], k[a], now - begin)
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
    """sim.engine.Fleet._commit_stop's bookkeeping for parked engines stopped at a push (chosen),
    each after its first jcount jumps and, where it was cutting a jump, cut_d more iterations of
    it (cut_b running; finishing: the jump's completions when those iterations end it, else 0).

    Returns per engine its progress, KV context and the samples its ended jumps completed; per
    row of the plan its fate: 0 it decodes on after the load (or its engine did not stop), 1
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
    """sim.engine.Fleet._park's admission for n engines: the running rows (owner, sid, fin, joined)
    and, after them, the inbox entries taken (joining at the engine's progress). Returns per engine
    the samples running, admitted and left in the inbox, and the prompt tokens admitted; and the
    rows (owner, sid, finish, joined) with a flag for the admitted ones."""
    running = _counts(owner, n)
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
    """sim.engine.Fleet._admissible: which engines (free ones, running rows `owner`) admit the head
    of their inbox (in_owner grouped by engine, in order) whole, and which entries those heads are.
    The head is what the batch has slots for; each must fit in the KV cache's room on top of the
    engine's context, except the first of an empty engine, which is always taken."""
    running = _counts(owner, len(free))
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
def take_due(times: np.ndarray, sids: np.ndarray, versions: np.ndarray, parts: np.ndarray, ranks: np.ndarray,
             limit: np.ndarray, now: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, float]:
    """sim.pending.Pending.due's pass over the pool: entries due by `now` are marked delivered
    (time set to infinity). Returns the sample ids of those not cut off (rank below their part's
    limit) grouped by start version (a counting sort), the versions and how many of each; how many
    entries were marked, and the earliest time left."""
    hit = np.empty(len(times), np.int64)
    n_hit, n_valid, nxt = 0, 0, np.inf
    low, high = np.iinfo(np.int64).max, np.iinfo(np.int64).min
    for i in range(len(times)):
        t = times[i]
        if t <= now:
            times[i] = np.inf
            n_hit += 1
            if ranks[i] < limit[parts[i]]:
                hit[n_valid] = i
                n_valid += 1
                low, high = min(low, versions[i]), max(high, versions[i])
        elif t < nxt:
            nxt = t
    if n_valid == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64), n_hit, nxt
    first = np.zeros(high - low + 2, np.int64)
    for q in range(n_valid):
        first[versions[hit[q]] - low + 1] += 1
    levels, counts = np.empty(high - low + 1, np.int64), np.empty(high - low + 1, np.int64)
    m = 0
    for v in range(high - low + 1):
        if first[v + 1]:
            levels[m], counts[m] = low + v, first[v + 1]
            m += 1
        first[v + 1] += first[v]
    out = np.empty(n_valid, np.int64)
    for q in range(n_valid):
        i = hit[q]
        out[first[versions[i] - low]] = sids[i]
        first[versions[i] - low] += 1
    return out, levels[:m], counts[:m], n_hit, nxt


@njit(cache=True)
def split_stopped(chosen: np.ndarray, fate: np.ndarray, n_done: np.ndarray, rows: np.ndarray, sid: np.ndarray,
                  fin: np.ndarray, joined: np.ndarray, version: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                             np.ndarray, np.ndarray, np.ndarray]:
    """The rows of engines stopped at a push (`stop_rows`' fates), split: the completed ones' tokens
    to credit (sample, engine's version, tokens since it joined); those completed by the iteration
    in progress (engine, rank among what its plan completes); and those that decode on, with their
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
def first_jump(sid: np.ndarray, finish: np.ndarray, joined: np.ndarray, progress: int, context: float, kv: float,
               exit_tokens: np.ndarray, base: np.ndarray, slope: np.ndarray, ds: float, t0: float
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int, int, float, float]:
    """sim.planning.plan_first_jump: one engine's batch sorted by (finish, sid) (an insertion sort:
    a running batch is sorted but for the samples just joined), and its jump to the first
    completion, cut where the KV cache would overflow: (sorted sid, finish, joined; b, k,
    completions, end, KV context after it)."""
    b = len(sid)
    sid, finish, joined = sid.copy(), finish.copy(), joined.copy()
    for i in range(1, b):
        s, f, j = sid[i], finish[i], joined[i]
        q = i - 1
        while q >= 0 and (finish[q] > f or (finish[q] == f and sid[q] > s)):
            sid[q + 1], finish[q + 1], joined[q + 1] = sid[q], finish[q], joined[q]
            q -= 1
        sid[q + 1], finish[q + 1], joined[q + 1] = s, f, j
    first = finish[0]
    n, freed = 0, 0
    while n < b and finish[n] == first:
        freed += exit_tokens[sid[n]]
        n += 1
    k = first - progress
    room = (kv - context) // b
    if room < k:  # the cache overflows first: stop there
        k0 = max(1, min(k, int(room))) if room >= 1 else 1
        if k0 != k:
            n, freed, k = 0, 0, k0
    end = t0 + jump_total(base, slope, ds, b, context, k)
    return sid, finish, joined, b, k, n, end, context + (b * k - freed)


@njit(cache=True)
def route_few(n: int, accepting: np.ndarray, loads: np.ndarray, caps: np.ndarray, keys: np.ndarray,
              row: np.ndarray, few: int) -> tuple[np.ndarray, bool]:
    """sim.controller.water_fill when at most `few` samples can be placed (a completion freed a slot
    or two): each in turn to the accepting engine with the smallest (keys[row[e], load + 1], e)
    that has room, as the one-at-a-time heap would (keys rising with load). Returns the engines
    and True; or nothing and False when more than `few` would be placed (the caller water-fills)."""
    width = keys.shape[1]
    loads = loads.copy()
    room = 0
    for e in range(len(loads)):
        if accepting[e] and loads[e] < caps[e]:
            room += caps[e] - loads[e]
    if min(n, room) > few:
        return np.empty(0, np.int64), False
    key = np.empty(len(loads))
    for e in range(len(loads)):
        free = accepting[e] and loads[e] < caps[e] and loads[e] + 1 < width
        key[e] = keys[row[e], loads[e] + 1] if free else np.inf
    out = np.empty(min(n, room), np.int64)
    for m in range(len(out)):
        e = np.argmin(key)  # the first of equal keys: the lowest engine
        if key[e] == np.inf:  # no room left anywhere
            return out[:m], True
        out[m] = e
        loads[e] += 1
        key[e] = keys[row[e], loads[e] + 1] if loads[e] < caps[e] and loads[e] + 1 < width else np.inf
    return out, True


@njit(cache=True)
def tally_lags(totals: np.ndarray, trained_step: np.ndarray, sids: np.ndarray, versions: np.ndarray,
               tokens: np.ndarray) -> None:
    """sim.samples.Samples.staleness_tokens for one credit: add tokens[i] to totals[lag] for each
    trained sample sids[i], lag = its training step - the version that generated them (versions[i],
    or versions[0] for all)."""
    shared = len(versions) == 1
    for i in range(len(sids)):
        step = trained_step[sids[i]]
        if step >= 0 and tokens[i] > 0:
            totals[step - (versions[0] if shared else versions[i])] += tokens[i]


@njit(cache=True)
def _slots_below(v: int, loads: np.ndarray, caps: np.ndarray, row: np.ndarray, below: np.ndarray,
                 out: np.ndarray) -> int:
    """Per engine, its free slots whose key is <= the v-th key value (into out); their sum."""
    total = 0
    for e in range(len(loads)):
        out[e] = max(min(below[row[e], v], caps[e]) - loads[e], 0)
        total += out[e]
    return total


@njit(cache=True)
def water_fill_kernel(n: int, loads: np.ndarray, caps: np.ndarray, row: np.ndarray, n_values: int,
                      rank: np.ndarray, below: np.ndarray) -> np.ndarray:
    """sim.controller.water_fill on its key table (sim.controller.key_table: n_values distinct
    finite keys, each slot key's rank among them, `below`): a bisection for the smallest key value
    whose slots cover n, then those slots by (key, engine, load), a counting sort on the key's
    rank over slots laid out by (engine, load)."""
    take = np.empty(len(loads), np.int64)
    lo, hi = 0, n_values - 1
    if _slots_below(hi, loads, caps, row, below, take) > n:
        while lo < hi:  # smallest key value whose slots cover n
            mid = (lo + hi) // 2
            if _slots_below(mid, loads, caps, row, below, take) >= n:
                hi = mid
            else:
                lo = mid + 1
    _slots_below(hi, loads, caps, row, below, take)
    first = np.zeros(n_values + 2, np.int64)  # per key rank (n_values: an infinite key), then prefix sums
    for e in range(len(loads)):
        for level in range(loads[e], loads[e] + take[e]):
            first[rank[row[e], level + 1] + 1] += 1
    for r in range(n_values + 1):
        first[r + 1] += first[r]
    out = np.empty(first[n_values + 1], np.int64)
    for e in range(len(loads)):
        for level in range(loads[e], loads[e] + take[e]):
            r = rank[row[e], level + 1]
            out[first[r]] = e
            first[r] += 1
    return out[:n]


@njit(cache=True)
def group_by_owner(owner: np.ndarray, sid: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Entries (owner[i] in 0..n-1, sid[i]) grouped by owner, each group in its entries' order
    (a stable counting sort)."""
    first = _bounds(owner, n)
    out_owner, out_sid = np.empty(len(owner), np.int64), np.empty(len(owner), np.int64)
    for i in range(len(owner)):
        q = first[owner[i]]
        out_owner[q], out_sid[q] = owner[i], sid[i]
        first[owner[i]] += 1
    return out_owner, out_sid


@njit(cache=True)
def file_entries(times_buf: np.ndarray, sid_buf: np.ndarray, version_buf: np.ndarray, part_buf: np.ndarray,
                 rank_buf: np.ndarray, at: int, times: np.ndarray, sids: np.ndarray, start_version: np.ndarray,
                 first_part: int, owner: np.ndarray, ranks: np.ndarray) -> float:
    """sim.pending.Pending's filing: entries written into the pool's buffers from `at` on, entry i
    (sample sids[i], start version start_version[sids[i]]) number ranks[i] of part
    first_part + owner[i] (empty owner: all of part first_part, ranked in order). Returns the
    earliest time filed."""
    one_part = len(owner) == 0
    earliest = np.inf
    for i in range(len(times)):
        q = at + i
        times_buf[q], sid_buf[q], version_buf[q] = times[i], sids[i], start_version[sids[i]]
        part_buf[q] = first_part if one_part else first_part + owner[i]
        rank_buf[q] = i if one_part else ranks[i]
        earliest = min(earliest, times[i])
    return earliest


@njit(cache=True)
def file_plans(times_buf: np.ndarray, sid_buf: np.ndarray, version_buf: np.ndarray, part_buf: np.ndarray,
               rank_buf: np.ndarray, at: int, rows: np.ndarray, jumps: np.ndarray, done: np.ndarray, ends: np.ndarray,
               sid: np.ndarray, reward: np.ndarray, start_version: np.ndarray, first_part: int) -> float:
    """`file_entries` for what n engines' plans complete (sim.planning.FlatPlans: engine e's first
    rows, in jump order, each at its jump's end plus the engine's reward latency), as part
    first_part + e, ranked in order. Returns the earliest time filed."""
    earliest = np.inf
    q = at
    for e in range(len(rows) - 1):
        r = rows[e]
        for j in range(jumps[e], jumps[e + 1]):
            t = ends[j] + reward[e]
            for _ in range(done[j]):
                times_buf[q], sid_buf[q], version_buf[q] = t, sid[r], start_version[sid[r]]
                part_buf[q], rank_buf[q] = first_part + e, r - rows[e]
                earliest = min(earliest, t)
                q += 1
                r += 1
    return earliest


@njit(cache=True)
def compact_pool(times: np.ndarray, sids: np.ndarray, versions: np.ndarray, parts: np.ndarray, ranks: np.ndarray,
                 limit: np.ndarray) -> int:
    """sim.pending.Pending's compaction: entries delivered (time infinite) or cut off (rank at or
    past their part's limit) dropped, the others moved to the front in order; returns how many."""
    m = 0
    for i in range(len(times)):
        if times[i] < np.inf and ranks[i] < limit[parts[i]]:
            times[m], sids[m], versions[m], parts[m], ranks[m] = times[i], sids[i], versions[i], parts[i], ranks[i]
            m += 1
    return m


@njit(cache=True)
def reload_rows(owner: np.ndarray, sid: np.ndarray, joined: np.ndarray, progress: np.ndarray, version: np.ndarray,
                generated: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """sim.engine.Fleet._load_group's pass over the running rows of engines that load new weights:
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
    """sim.engine.Fleet._record_phases for parked engines `which` (local indices): the re-prefills,
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


@njit(cache=True)
def add_busy(acc: np.ndarray, touched: np.ndarray, idx: np.ndarray, starts: np.ndarray, ends: np.ndarray,
             part: np.ndarray) -> None:
    """sim.recorder.Recorder's busy time for one array of intervals of several resources: each
    resource's lengths summed in the order filed from 0.0 (as np.bincount adds its weights), then
    that sum added to acc (in place), and the resource marked touched when the sum is not 0.
    `part` is scratch space of acc's length, all NaN (it is left so)."""
    for i in range(len(idx)):
        r = idx[i]
        part[r] = (ends[i] - starts[i]) if np.isnan(part[r]) else part[r] + (ends[i] - starts[i])
    for i in range(len(idx)):
        r = idx[i]
        if not np.isnan(part[r]):
            acc[r] += part[r]
            touched[r] |= part[r] != 0
            part[r] = np.nan
