"""What a weight update costs an engine that is not interruptible: it drains its batch first.

The simulator's engine (sim.engine.Engine.run, `accepting`) takes no new sample while an update is
pending and loads the new weights only once its batch is empty. So at every trainer step it runs
the n samples it holds down to the last one while no new sample joins, and then waits for the
weights if they are not in yet. Under continuous batching the samples held at a random instant are
length-biased and part-way through (renewal theory: a held sample's residual length R = U o, o
drawn with probability proportional to its length, U uniform; E[R] = E[o^2] / (2 E[o])), so the
drain takes about E[max of n R] decode iterations, in which the engine does n E[R] tokens of work
that a full batch would have done in E[R] iterations. Each step it loses

    loss(n) = (E[max_n R] - E[R]) t(n) + max(0, sync - E[max_n R] t(n)),   t(n) = n / (rate(n) E[o])

seconds at its steady rate (t(n): one decode iteration at load n, from the steady rate by
Little's law, n samples of E[o] tokens each completing at rate(n)), which EngineOption.derated
takes out of each trainer period as it does an interruptible engine's weight wait. The thinning
batch decodes faster than a full one, so this errs on the side of a larger loss.
"""

from __future__ import annotations

import numpy as np

RESIDUAL_DRAWS = 1 << 14  # seeded residual lengths per workload


def residual_lengths(draws: np.ndarray, seed: int = 0) -> np.ndarray:
    """Sorted residual lengths R = U o of held samples: o length-biased from `draws`, U uniform."""
    rng = np.random.default_rng(seed)
    lengths = np.asarray(draws, float)
    picked = rng.choice(lengths, size=RESIDUAL_DRAWS, p=lengths / lengths.sum())
    return np.sort(picked * rng.random(RESIDUAL_DRAWS))


def drain_loss_seconds(residuals: np.ndarray, points: np.ndarray, rates: np.ndarray, mean_length: float,
                       sync_seconds: float) -> np.ndarray:
    """loss(n) per load point n (the module docstring), for an engine of steady `rates` at `points`."""
    n = points.astype(float)
    longest = np.quantile(residuals, n / (n + 1))  # E[max of n] ~ the n/(n+1) quantile
    iteration = n / (np.maximum(np.asarray(rates, float), 1e-300) * mean_length)
    drain = longest * iteration
    return np.maximum(0.0, longest - residuals.mean()) * iteration + np.maximum(0.0, sync_seconds - drain)
