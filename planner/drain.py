"""Drain curves: what an engine does with a batch it is handed at once.

A one-shot batch thins out as its samples finish (`drain_rates`); an engine that is not
interruptible loses that time per step, draining before each update (`drain_update_seconds`,
planner.tail_model); the race for each version's samples is priced from the drain curves
(`LazyDrain`, planner.rate_model.raced), and so is the expected longest of a cohort.
"""

from __future__ import annotations

import functools

import numpy as np

from planner.tail_model import LENGTH_PROBS, DrainCurve, drain_loss_seconds
from planner.tail_model import longest_of as expected_longest_of
from traces import CostModel, GpuType, Workload
from traces.lengths import LengthDist


class LazyDrain:
    """One engine option's drain_curve, built when planner.rate_model.raced first asks for it: only the answer
    (and what the planner confirms) is raced, so building every option's curve up front was wasted
    work on most requests (a third of the candidate build on the demo fleet, not interruptible).
    Derated copies of an option share it."""

    def __init__(self, cm: CostModel, gpu: GpuType, workload: Workload, tp: int, ep: int, points: np.ndarray,
                 draws: np.ndarray) -> None:
        self._args = (cm, gpu, workload, tp, ep, points, draws)
        self._curve: DrainCurve | None = None

    def curve(self) -> DrainCurve:
        if self._curve is None:
            cm, gpu, workload, tp, ep, points, draws = self._args
            # D(n) bends where decode turns compute-bound: between powers of two a chord is up to 5% off (H20,
            # 7B, D(21): 9.54 s against 9.03), enough to misjudge whether a batch drains before a publish
            dense = np.unique(np.r_[points, np.round(np.geomspace(1.0, float(points[-1]), 8 * len(points)))])
            self._curve = drain_curve(cm, gpu, workload, tp, ep, dense, draws, _longest_of(workload.response_len))
        return self._curve


def drain_curve(cm: CostModel, gpu: GpuType, workload: Workload, tp: int, ep: int, points: np.ndarray,
                draws: np.ndarray, longest: tuple[float, ...]) -> DrainCurve:
    """D(n) = n / drain_rates(n) at the load points, and the simulator's routing key there: one decode
    iteration of n samples at a mean-length sample's context, prompt + E[o] / 2 (sim.simulate)."""
    seconds = points / drain_rates(cm, gpu, workload, tp, points, draws, ep, longest)
    mean = workload.prompt_len.expected() + workload.response_len.expected() / 2
    keys = np.asarray(cm.decode(gpu, workload.model, tp, points, mean, ep).seconds, float)
    quantiles = np.quantile(draws, LENGTH_PROBS)
    # the longest sample runs alone at the end: one iteration of one sample at a long sample's mean context
    alone = float(cm.decode(gpu, workload.model, tp, 1, workload.prompt_len.expected() + quantiles[-1] / 2, ep
                            ).seconds)
    return DrainCurve(tuple(points.astype(float).tolist()), tuple(seconds.tolist()), tuple(keys.tolist()),
                      tuple(quantiles.tolist()), alone, longest)


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
    """On-policy samples/s of one engine handed n (`points`) samples at once: n / D(n), where the
    drain D(n) = their prefill + the sum over decode positions k of one iteration with the
    n S(k) samples still running (S: the response lengths' survival, from sorted seeded `draws`),
    up to the expected longest of n. A steady-state rate would keep the batch full; a one-shot
    batch thins out and ends on its longest sample alone."""
    prompt = workload.prompt_len.expected()
    n = points.astype(float)[:, None]
    if longest_of:  # E[max of n] of seeded cohorts (planner.tail_model.longest_of)
        longest = expected_longest_of(longest_of, n[:, 0])[:, None]
    else:  # E[max of n] ~ the n/(n+1) quantile
        longest = np.quantile(draws, n[:, 0] / (n[:, 0] + 1))[:, None]
    k = longest * np.linspace(0.0, 1.0, 65)[None, :]
    running = np.maximum(1.0, n * (1 - np.searchsorted(draws, k, "right") / len(draws)))
    it = np.asarray(cm.decode(gpu, workload.model, tp, running, prompt + k, ep).seconds, dtype=float)
    decode = ((it[:, 1:] + it[:, :-1]) / 2 * np.diff(k, axis=1)).sum(axis=1)
    fill = np.asarray(cm.prefill(gpu, workload.model, tp, n[:, 0] * prompt, prompt, ep).seconds, dtype=float)
    return n[:, 0] / (decode + fill)


@functools.lru_cache(maxsize=64)  # every drain curve of a request asks for the same lengths' figures
def _longest_of(dist: LengthDist) -> tuple[float, ...]:
    """The expected longest of 2^k responses, k < LONGEST_OF."""
    return tuple(expected_longest(dist, 2 ** k) for k in range(LONGEST_OF))


def expected_longest(dist: LengthDist, n: int, cohorts: int = 16) -> float:
    """Mean longest response of a cohort of n samples admitted together (seeded draws).

    The staleness rule waits for the longest sample of each cohort, which for a capped long tail
    is often below the cap (lognormal mean 600, sigma 1, cap 8192: about 6,550 at n = 512).
    """
    draws = dist.sample(np.random.default_rng(0), n * cohorts).reshape(cohorts, n)
    return float(draws.max(axis=1).mean())
