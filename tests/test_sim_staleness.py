"""Samples.staleness_tokens, its one-element version arrays made once per version, tallies what it did
making one per credit."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from sim.kernels.tallies import tally_lags
from sim.samples import Samples


def _per_credit(s: Samples) -> Counter[int]:
    """staleness_tokens as it was (commit a3774f7): a version array made for each credit."""
    totals = np.zeros(int(s.trained_step.max()) + 1, np.int64)
    for sids, version, tokens in zip(s._credit_sids, s._credit_versions, s._credit_tokens, strict=True):
        tally_lags(totals, s.trained_step, sids, np.atleast_1d(np.asarray(version, np.int64)), tokens)
    return Counter({int(k): int(v) for k, v in enumerate(totals) if v > 0})


@pytest.mark.parametrize("seed", range(5))
def test_shared_version_arrays_tally_as_before(seed: int) -> None:
    """Credits of one version (int or numpy int), of one version per sample, of a one-element version
    array for several samples; untrained samples and tokens <= 0 count for nothing."""
    rng = np.random.default_rng(seed)
    n, steps = 300, 8
    s = Samples(rng.integers(10, 100, n), rng.integers(10, 100, n))
    s.trained_step[:] = np.where(rng.random(n) < 0.7, rng.integers(0, steps, n), -1)
    for _ in range(400):
        sids = rng.choice(n, int(rng.integers(1, 6)), replace=False).astype(np.int64)
        tokens = rng.integers(-3, 50, len(sids)).astype(np.int64)
        low = s.trained_step[sids].clip(0).min()  # a version no later than the step that trained it
        kind = rng.integers(0, 4)
        version: int | np.ndarray = (int(rng.integers(0, low + 1)) if kind == 0 else np.int64(rng.integers(0, low + 1))
                                     if kind == 1 else rng.integers(0, low + 1, len(sids)) if kind == 2
                                     else np.array([rng.integers(0, low + 1)]))
        s.credit(sids, version, tokens)
    s.credit(np.empty(0, np.int64), 0, np.empty(0, np.int64))  # an empty credit is not kept
    got = s.staleness_tokens()
    assert got == _per_credit(s) and sum(got.values()) > 0
    assert all(type(k) is int and type(v) is int for k, v in got.items())


def test_no_credits() -> None:
    assert Samples(np.ones(3), np.ones(3)).staleness_tokens() == Counter()
