"""What a weight update costs an engine that is not interruptible: it drains its batch first.

The simulator's engine (sim.engine.Engine.run, `accepting`) takes no new sample while an update is
pending and loads the new weights only once its batch is empty. So at every trainer step it runs
the n samples it holds down to the last one while no new sample joins, and then waits for the
weights if they are not in yet. Under continuous batching the samples held at a random instant are
length-biased and part-way through (renewal theory: a held sample's residual length R = U o, o
drawn with probability proportional to its length, U uniform; E[R] = E[o^2] / (2 E[o])). The
drain runs decode positions k = 0 .. E[max of n R] with the n S_R(k) samples still running
(S_R: the residuals' survival), each iteration priced by the cost model at that batch, as
planner.candidates.drain_rates prices a one-shot batch:

    D(n) = sum_k t(n S_R(k)),    loss(n) = max(D(n), sync) - E[R] t(n)

seconds per step: the drain (or the weights, if they come later) less the n E[R] tokens of work
it did, which a full batch of n would have done in E[R] iterations of t(n).
EngineOption.derated takes the loss out of each trainer period, as it does an interruptible
engine's weight wait.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

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
