"""What a weight update costs an engine that is not interruptible: it drains its batch first.

The simulator's engine (sim.engine.Engine.run, `accepting`) takes no new sample while an update is
pending and loads the new weights only once its batch is empty. So at every trainer step it runs
the n samples it holds down to the last one while no new sample joins, and then waits for the
weights if they are not in yet. Under continuous batching the samples held at a random instant are
length-biased and part-way through (renewal theory: a held sample's residual length R = U o, o
drawn with probability proportional to its length, U uniform; E[R] = E[o^2] / (2 E[o])). The
drain runs decode positions k = 0 .. E[max of n R] with the n S_R(k) samples still running
(S_R: the residuals' survival), each iteration priced by the cost model at that batch, as
planner.drain.drain_rates prices a one-shot batch:

    D(n) = sum_k t(n S_R(k)),    loss(n) = max(D(n), sync) - E[R] t(n)

seconds per step: the drain (or the weights, if they come later) less the n E[R] tokens of work
it did, which a full batch of n would have done in E[R] iterations of t(n).
EngineOption.derated takes the loss out of each trainer period, as it does an interruptible
engine's weight wait.

That loss assumes every version's samples spread over all engines. The simulator does not spread
them so: an engine still draining when the weights come in accepts nothing until it has drained,
and the first to drain takes what the version admits (race steps this version by version;
with fixed lengths, eta 1, it halves the rate: bench/analytic_vs_sim.py seed 0 #18, 131 samples/s
by the slopes, 65 by the race, 65 simulated). planner.rate_model.raced prices the MILP's answer with it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from traces.records import period, steady_state, warm_steps
from traces.routing import Router
from traces.staleness import admission_cap, lag_bound

RESIDUAL_DRAWS = 1 << 14  # seeded residual lengths per workload
POSITIONS = 65  # decode positions priced along a drain (as drain_rates)
IterationSeconds = Callable[[np.ndarray, np.ndarray], np.ndarray]  # (running, context) -> one iteration's s


def residual_lengths(draws: np.ndarray, seed: int = 0) -> np.ndarray:
    """Sorted residual lengths R = U o of held samples: o length-biased from `draws`, U uniform."""
    rng = np.random.default_rng(seed)
    lengths = np.asarray(draws, float)
    picked = rng.choice(lengths, size=RESIDUAL_DRAWS, p=lengths / lengths.sum())
    return np.sort(picked * rng.random(RESIDUAL_DRAWS))


def drain_loss_seconds(residuals: np.ndarray, points: np.ndarray, iteration: IterationSeconds, context: float,
                       sync_seconds: float) -> np.ndarray:
    """loss(n) per load point n (the module docstring); `iteration(running, context)` prices one
    decode iteration, `context` is the mean context of a held sample (prompt plus what it generated)."""
    n = points.astype(float)[:, None]
    longest = np.quantile(residuals, n[:, 0] / (n[:, 0] + 1))[:, None]  # E[max of n] ~ the n/(n+1) quantile
    k = longest * np.linspace(0.0, 1.0, POSITIONS)[None, :]
    running = np.maximum(1.0, n * (1 - np.searchsorted(residuals, k, "right") / len(residuals)))
    it = np.asarray(iteration(running, context + k), dtype=float)
    drain = ((it[:, 1:] + it[:, :-1]) / 2 * np.diff(k, axis=1)).sum(axis=1)
    full = np.asarray(iteration(n[:, 0], np.full(len(n), context)), dtype=float)
    return np.maximum(0.0, np.maximum(drain, sync_seconds) - residuals.mean() * full)


# ---- the version race: where each version's allowance lands (non-interruptible engines) ---------
@dataclass(frozen=True)
class DrainCurve:
    """One engine handed n samples at once: D(n), the seconds until its last one finishes (its
    prefill, then a batch that thins as samples finish: planner.drain.drain_seconds), the
    router's key (one decode iteration of n mean-length samples: sim.simulate's mean_iteration_s),
    the response lengths' quantiles at LENGTH_PROBS, one decode iteration alone (seconds), the expected
    longest of 2^k responses, the samples its KV cache runs at once, and [i, j] the share of D(points[i])
    spent until position j / (POSITIONS - 1) of that longest (None: in proportion to the length)."""

    points: tuple[float, ...]
    seconds: tuple[float, ...]
    keys: tuple[float, ...]
    quantiles: tuple[float, ...] = ()
    alone_seconds: float = 0.0
    longest: tuple[float, ...] = ()  # [k]: the expected longest of 2^k responses (seeded cohorts)
    running: float = math.inf  # samples the KV cache runs at once; more wait in the engine's queue
    elapsed: np.ndarray | None = field(default=None, compare=False, repr=False)  # a function of the fields above

    def drain(self, n: float) -> float:
        return float(np.interp(n, (0.0, *self.points), (0.0, *self.seconds)))

    @property
    def accepts(self) -> int:
        """The most samples the engine takes: the curve runs to them (planner.drain.LazyDrain)."""
        return int(self.points[-1])

    def longest_of(self, n: float) -> float:
        """The expected longest of n responses: E[max], above the n/(n+1) quantile for a long tail."""
        return float(longest_of(self.longest, n))

    def length(self, p: np.ndarray | float) -> np.ndarray:
        """The response length at probability p (the drawn lengths' quantile)."""
        return np.interp(p, LENGTH_PROBS, self.quantiles)

    def until(self, n: float, lengths: np.ndarray | float) -> np.ndarray:
        """Seconds from handing an engine n samples at once until one of these lengths finishes: along
        the drain D(n) up to the expected longest of n (the full batch's slow iterations first), alone
        past it; with more than it runs at once, after the queue (D(n) - D(running)), in the last drain."""
        if n > self.running:
            return self.drain(n) - self.drain(self.running) + self.until(self.running, lengths)
        own, total = max(self.longest_of(n), 1.0), self.drain(n)
        x = np.asarray(lengths, float) / own
        if self.elapsed is None:
            share = np.minimum(x, 1.0)
        else:
            at = np.interp(n, self.points, np.arange(len(self.points)))
            i = min(int(at), len(self.points) - 2) if len(self.points) > 1 else 0
            f = at - i
            row = self.elapsed[i] * (1 - f) + self.elapsed[min(i + 1, len(self.points) - 1)] * f
            share = np.interp(np.minimum(x, 1.0), np.linspace(0.0, 1.0, len(row)), row)
        return total * share + np.maximum(0.0, x - 1.0) * own * self.alone_seconds

    def completions(self, n: float, ranks: np.ndarray) -> np.ndarray:
        """Seconds from handing an engine n samples at once until its samples at these ranks (0-1) of
        finishing order finish: the j-th of n at length q(j / (n + 1)) along the drain; with a queue,
        its (n - running) / n first evenly over the queue's time (a steady stream), the rest in the last drain."""
        if n <= self.running:
            return self.until(n, self.length(ranks * n / (n + 1)))
        queue, first = self.drain(n) - self.drain(self.running), (n - self.running) / n
        last = self.until(self.running, self.length((ranks - first) / (1 - first) * self.running / (self.running + 1)))
        return np.where(ranks < first, queue * ranks / first, queue + last)


def longest_of(longest: Sequence[float], n: np.ndarray | float) -> np.ndarray:
    """The expected longest of n responses from `longest` ([k]: that of 2^k), log-interpolated."""
    return np.interp(np.log2(np.maximum(n, 1.0)), np.arange(len(longest)), longest)


# probabilities the lengths' quantiles are kept at: evenly, and into the tail (the longest of n ~ n/(n+1))
LENGTH_PROBS = np.unique(np.r_[np.linspace(0.0, 1.0, 129), 1.0 - 2.0 ** -np.arange(1, 18)])
CHUNKS = 8  # a batch's completions, in this many equal parts, at their quantiles
RACE_PERIODS = 6  # whole periods after the warm-up over which a trajectory's steady rate is taken
RACE_DRAWS = 4  # seeded trajectories the race's rate is the mean of
RACE_MAX_ENGINES = 512  # beyond this the per-engine race is not run (the slope model stands)


@dataclass(frozen=True)
class Race:
    """race's outcome: samples/s, and whether in the steady steps some engine still held samples when
    a trainer step published its weights. An interruptible engine differs from one that is not only
    there (it would be interrupted): where none does, the race prices interruptible engines too."""

    samples_per_s: float
    held_at_publish: bool


@functools.lru_cache(maxsize=4096)  # evaluate asks again for the same allocation at every derating
def race(engines: Sequence[tuple[DrainCurve, int, int]], batch: int, eta: float, step_seconds: float,
         sync_seconds: float, held_only: bool = False) -> Race:
    """Samples/s of engines that are not interruptible (curve, max batch, count each) under the
    simulator's admission and routing rules, stepped version by version (nan if too many engines):
    the mean over RACE_DRAWS seeded trajectories (`_trajectory`). One trajectory is one draw of a
    chaotic race: which engine drains first decides who takes the next version, and a slow engine
    that takes a whole version holds the steps behind it for its longest sample (bench/analytic_vs_sim.py
    seed 1 #47: seeded simulations run at 29-33 samples/s, one settled run at 58 in a passing regime).
    `held_only`: the caller needs the rate only where no engine holds samples at a publish, so the
    first trajectory where one does ends the race (rate nan)."""
    count = sum(n for _, _, n in engines)
    if count > RACE_MAX_ENGINES or not count:
        return Race(math.nan, True)
    runs = []
    for seed in range(RACE_DRAWS):
        runs.append(_trajectory(engines, batch, eta, step_seconds, sync_seconds, seed))
        if held_only and runs[-1].held_at_publish:
            return Race(math.nan, True)
    return Race(float(np.mean([r.samples_per_s for r in runs])), any(r.held_at_publish for r in runs))


def _trajectory(engines: Sequence[tuple[DrainCurve, int, int]], batch: int, eta: float, step_seconds: float,
                sync_seconds: float, seed: int) -> Race:
    """One seeded trajectory of the race.

    The rules (sim.controller, sim.engine, traces.staleness, traces.routing): version v's allowance
    (admission_cap: (eta + v + 1) B ever admitted) is only routed to engines that accept, i.e. hold
    weights v with no update pending. A trainer step publishes v + 1 and every engine gets a pending
    update; a non-interruptible one takes it only once its batch has drained, so it accepts again at
    max(its drain end, the weights in). Engines idle when the weights come in load them together and
    the router water-fills them on its key, whole samples; one still draining when they come in
    accepts alone, at its own drain end, and takes all the allowance left up to its max batch. No
    sample is admitted between versions, so every engine runs one-shot batches: a batch of n ends on
    its longest sample, drawn (seeded: its quantile u^(1/n), the max of n has CDF F^n), at
    DrainCurve.until (the drain to the expected longest of n, alone past it); the engine is busy until
    then, and its samples finish at their lengths' quantiles along the same drain (a batch's j-th of n
    at length q(j / (n + 1)), in CHUNKS parts). A version ends with its last batch. Step s starts
    once the trainer is free, (s + 1) B samples have finished and every sample admitted at versions
    <= s - ceil(eta) has (traces.staleness); it publishes after step_seconds - sync_seconds, the
    weights are in step_seconds after it starts. The rate is traces.records.steady_state's over
    warm-up + RACE_PERIODS periods; `held_at_publish`: some engine of the steady steps had not drained
    by a publish.
    """
    kind = np.repeat(np.arange(len(engines)), [n for _, _, n in engines])
    curves = [c for c, _, _ in engines]
    router = _router(engines, kind)
    lag = lag_bound(eta)
    steps = period(eta) * (1 + RACE_PERIODS)
    publish_after = max(0.0, step_seconds - sync_seconds)
    free = np.zeros(len(kind))  # when each engine's batch has drained
    done: list[tuple[float, float]] = []  # (time, samples) of completions, in CHUNKS parts per batch
    last: dict[int, float] = {}  # version admitted at -> when its last sample finishes
    dispatched, weights_in, step_ends = 0.0, 0.0, []
    warm, held = warm_steps(eta, steps), False
    rng = np.random.default_rng(seed)  # each batch's longest sample
    ranks = (np.arange(CHUNKS) + 0.5) / CHUNKS
    for s in range(steps):
        while True:
            start = _step_start(done, last, s, lag, batch, weights_in)
            left = admission_cap(eta, s, batch) - dispatched
            ready = np.maximum(free, weights_in)
            at = float(ready.min())
            if left < 0.5 or at >= start + publish_after:  # published v + 1 first: nobody accepts v any more
                break
            group = np.flatnonzero(free <= weights_in) if at == weights_in else np.array([int(ready.argmin())])
            accepting = np.zeros(len(kind), bool)
            accepting[group] = True
            share = np.bincount(router.route(round(left), accepting, np.zeros(len(kind), np.int64)),
                                minlength=len(kind))[group].astype(float)
            routed = float(share.sum())
            if routed <= 0:
                break
            for e, n in zip(group.tolist(), share.tolist(), strict=True):
                free[e] = at
                if n <= 0:
                    continue
                c = curves[kind[e]]
                end = at + float(c.until(n, c.length(rng.random() ** (1 / n))))
                finish = np.minimum(at + c.completions(n, ranks), end)
                done.extend(zip(finish.tolist(), [n / CHUNKS] * CHUNKS, strict=True))
                free[e] = end
                last[s] = max(last.get(s, 0.0), end)
            dispatched += routed
        if not math.isfinite(start):
            return Race(0.0, held)
        step_ends.append(start + publish_after)
        held = held or (s >= warm and bool((free > step_ends[-1] * (1 + 1e-9)).any()))
        weights_in = start + step_seconds
    samples, seconds = steady_state(step_ends, [batch] * len(step_ends), eta)
    return Race(samples / seconds if seconds > 0 else 0.0, held)


def _step_start(done: list[tuple[float, float]], last: dict[int, float], step: int, lag: int, batch: int,
                free: float) -> float:
    """When step `step` may start: the trainer free, every sample of versions <= step - lag finished,
    and (step + 1) B samples finished in all (inf until enough are routed)."""
    start = max([free, *(t for v, t in last.items() if v <= step - lag)])
    need, got = (step + 1) * batch - 1e-6, 0.0
    for t, n in sorted(done):
        got += n
        if got >= need:
            return max(start, t)
    return math.inf


def _router(engines: Sequence[tuple[DrainCurve, int, int]], kind: np.ndarray) -> Router:
    """The simulator's router (traces.routing) over the race's engines: whole samples, each to the
    accepting engine whose next iteration is shortest with one more, its key at b samples the
    curve's (interpolated between its load points). Whole samples matter: 14 samples spread as 0.9
    over 16 slow engines would keep all 16 draining, where the router gives them none and they are
    idle for the next version (bench/analytic_vs_sim.py seed 0 #47)."""
    tables = [np.r_[0.0, np.interp(np.arange(1, m + 1), c.points, c.keys)].tolist() for c, m, _ in engines]
    return Router([tables[k] for k in kind.tolist()], [engines[k][1] for k in kind.tolist()])
