"""Drain curves: what an engine does with a batch it is handed at once.

A one-shot batch thins out as its samples finish (`drain_rates`); an engine that is not
interruptible loses that time per step, draining before each update (`drain_update_seconds`,
planner.tail_model); the race for each version's samples is priced from the drain curves
(`LazyDrain`, planner.rate_model.raced), and so is the expected longest of a cohort.
"""

from __future__ import annotations

import functools

import numpy as np

from planner.tail_model import LENGTH_PROBS, POSITIONS, DrainCurve, drain_loss_seconds
from planner.tail_model import longest_of as expected_longest_of
from traces import CostModel, GpuType, Workload
from traces.lengths import LengthDist


class LazyDrain:
    """One engine option's drain_curve, built when planner.rate_model.raced first asks for it: only the answer
    (and what the planner confirms) is raced, so building every option's curve up front was wasted
    work on most requests (a third of the candidate build on the demo fleet, not interruptible).
    Derated copies of an option share it. `running`: the samples its KV cache runs at once (the
    option's batch); `seqs`: the samples it accepts (traces.plan.engine_seqs), the rest queued."""

    def __init__(self, cm: CostModel, gpu: GpuType, workload: Workload, tp: int, ep: int, points: np.ndarray,
                 draws: np.ndarray, running: int, seqs: int) -> None:
        self._args = (cm, gpu, workload, tp, ep, points, draws, running, seqs)
        self._curve: DrainCurve | None = None

    def curve(self) -> DrainCurve:
        if self._curve is None:
            cm, gpu, workload, tp, ep, points, draws, running, seqs = self._args
            # D(n) bends where decode turns compute-bound: between powers of two a chord is up to 5% off (H20,
            # 7B, D(21): 9.54 s against 9.03), enough to misjudge whether a batch drains before a publish
            top = float(max(points[-1], seqs))
            dense = np.unique(np.r_[points, running, seqs, np.round(np.geomspace(1.0, top, 8 * len(points)))])
            quantiles, longest = _tail(workload.response_len)
            self._curve = drain_curve(cm, gpu, workload, tp, ep, dense, draws, longest, quantiles, running)
        return self._curve


def drain_curve(cm: CostModel, gpu: GpuType, workload: Workload, tp: int, ep: int, points: np.ndarray,
                draws: np.ndarray, longest: tuple[float, ...], quantiles: tuple[float, ...], running: int
                ) -> DrainCurve:
    """D(n) at the load points, and the simulator's routing key there: one decode iteration of n
    samples at a mean-length sample's context, prompt + E[o] / 2, their KV held to the cache
    (sim.simulate's mean_iteration_s); `longest` and `quantiles` as `_tail` gives them. Up to the
    `running` samples the KV cache runs at once, D(n) is the one-shot drain (`drain_seconds`); past
    them the rest queue and join as samples finish, at the engine's steady rate at that batch
    (CostModel.generation_rate), before the last `running` drain: D(n) = (n - running) / r + D(running)."""
    fits = points <= running
    seconds, elapsed = drain_seconds(cm, gpu, workload, tp, points[fits], draws, ep, longest)
    if not fits.all():
        prompt, response = workload.prompt_len.expected(), workload.response_len.expected()
        rate = float(np.asarray(cm.generation_rate(
            gpu, workload.model, tp, prompt_mean=prompt, response_mean=response,
            response_sq_mean=workload.response_len.expected_square(), max_num_seqs=running, ep=ep).samples_per_s))
        seconds = np.r_[seconds, seconds[-1] + (points[~fits] - running) / rate]
        elapsed = np.r_[elapsed, np.repeat(elapsed[-1:], int((~fits).sum()), axis=0)]
    mean = workload.prompt_len.expected() + workload.response_len.expected() / 2
    kv = float(cm.kv_capacity_tokens(gpu, workload.model, tp, ep))
    keys = np.asarray(cm.decode(gpu, workload.model, tp, points, np.minimum(kv, points * mean) / points, ep).seconds,
                      float)
    # the longest sample runs alone at the end: one iteration of one sample at a long sample's mean context
    alone = float(cm.decode(gpu, workload.model, tp, 1, workload.prompt_len.expected() + float(np.max(draws)) / 2,
                            ep).seconds)
    return DrainCurve(tuple(points.astype(float).tolist()), tuple(seconds.tolist()), tuple(keys.tolist()),
                      quantiles, alone, longest, float(running), elapsed / seconds[:, None])


def drain_update_seconds(cm: CostModel, gpu: GpuType, workload: Workload, tp: int, ep: int, points: np.ndarray,
                         residuals: np.ndarray, context: float, sync_seconds: float) -> tuple[float, ...]:
    """Seconds per trainer step a non-interruptible engine loses draining its batch (and waiting for
    the weights) at each load point (planner.tail_model)."""
    def iteration(running: np.ndarray, ctx: np.ndarray) -> np.ndarray:
        return np.asarray(cm.decode(gpu, workload.model, tp, running, ctx, ep).seconds, dtype=float)

    return tuple(drain_loss_seconds(residuals, points, iteration, context, sync_seconds).tolist())


DRAWS = 4096  # seeded response draws for the on-policy drain curve
LONGEST_OF = 14  # the expected longest of 2^k responses, k < this (cohorts up to 8192 samples)


def drain_rates(cm: CostModel, gpu: GpuType, workload: Workload, tp: int, points: np.ndarray,
                draws: np.ndarray, ep: int = 1, longest_of: tuple[float, ...] = ()) -> np.ndarray:
    """On-policy samples/s of one engine handed n (`points`) samples at once: n / D(n) (`drain_seconds`).
    A steady-state rate would keep the batch full; a one-shot batch thins out and ends on its longest
    sample alone."""
    return points.astype(float) / drain_seconds(cm, gpu, workload, tp, points, draws, ep, longest_of)[0]


def drain_seconds(cm: CostModel, gpu: GpuType, workload: Workload, tp: int, points: np.ndarray,
                  draws: np.ndarray, ep: int = 1, longest_of: tuple[float, ...] = ()) -> tuple[np.ndarray, np.ndarray]:
    """The drain D(n) of one engine handed n (`points`) samples at once: their prefill + the sum over
    decode positions k of one iteration with the n S(k) samples still running (S: the response
    lengths' survival, from sorted seeded `draws`), up to the expected longest of n; and [n, j] the
    seconds until position j / (POSITIONS - 1) of that longest is reached (prefill included). The
    early positions run the full batch, the slowest iterations, so a sample of half the longest
    length finishes later than half-way through the drain."""
    prompt = workload.prompt_len.expected()
    n = points.astype(float)[:, None]
    if longest_of:  # E[max of n] of seeded cohorts (planner.tail_model.longest_of)
        longest = expected_longest_of(longest_of, n[:, 0])[:, None]
    else:  # E[max of n] ~ the n/(n+1) quantile
        longest = np.quantile(draws, n[:, 0] / (n[:, 0] + 1))[:, None]
    k = longest * np.linspace(0.0, 1.0, POSITIONS)[None, :]
    running = np.maximum(1.0, n * (1 - np.searchsorted(draws, k, "right") / len(draws)))
    it = np.asarray(cm.decode(gpu, workload.model, tp, running, prompt + k, ep).seconds, dtype=float)
    fill = np.asarray(cm.prefill(gpu, workload.model, tp, n[:, 0] * prompt, prompt, ep).seconds, dtype=float)
    steps = (it[:, 1:] + it[:, :-1]) / 2 * np.diff(k, axis=1)
    elapsed = fill[:, None] + np.c_[np.zeros(len(n)), np.cumsum(steps, axis=1)]
    return steps.sum(axis=1) + fill, elapsed  # the sum as drain_rates has always taken it (same plans)


TAIL_DRAWS = 1 << 17  # seeded lengths behind a drain curve's tail: the race draws the longest of up to 8k


@functools.lru_cache(maxsize=64)  # every drain curve of a request asks for the same lengths' figures
def _tail(dist: LengthDist) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The response lengths' quantiles at LENGTH_PROBS and the expected longest of 2^k responses (k <
    LONGEST_OF), both of TAIL_DRAWS sorted seeded draws s: E[max of n] = sum_i s_i ((i / M)^n - ((i - 1) / M)^n),
    exact for those draws. 16 cohorts of 1,024 put it at 3,254 tokens where 20,000 put it at 3,442 (lognormal
    mean 600, sigma 0.6, cap 4,096), and 4,096 draws' quantiles at 2,909: a sync step waits for that longest."""
    draws = np.sort(dist.sample(np.random.default_rng(0), TAIL_DRAWS).astype(float))
    cdf = np.arange(1, TAIL_DRAWS + 1) / TAIL_DRAWS
    longest = tuple(float(draws @ np.diff(np.r_[0.0, cdf ** (2 ** k)])) for k in range(LONGEST_OF))
    return tuple(np.quantile(draws, LENGTH_PROBS).tolist()), longest


def expected_longest(dist: LengthDist, n: int, cohorts: int = 16) -> float:
    """Mean longest response of a cohort of n samples admitted together (seeded draws).

    The staleness rule waits for the longest sample of each cohort, which for a capped long tail
    is often below the cap (lognormal mean 600, sigma 1, cap 8192: about 6,550 at n = 512).
    """
    draws = dist.sample(np.random.default_rng(0), n * cohorts).reshape(cohorts, n)
    return float(draws.max(axis=1).mean())
