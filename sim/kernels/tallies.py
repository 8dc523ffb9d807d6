"""End-of-run and per-interval tallies: trained tokens by staleness (sim.samples), busy time (sim.recorder)."""

from __future__ import annotations

import numpy as np
from numba import njit


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
