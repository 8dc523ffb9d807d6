"""Token-length distributions: prompt, response and tool-result lengths, turns per episode."""

from __future__ import annotations

import functools
import math
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator
from scipy.special import ndtr  # the standard normal CDF (scipy.stats' norm.cdf, without its slow import)

_FROZEN = ConfigDict(frozen=True, extra="forbid")
MAX_TOKENS = 1_048_576  # longest sequence we accept: 1M tokens


class LengthDist(BaseModel):
    """A token-length distribution.

    kind: fixed (value) | uniform (low..high inclusive) | lognormal (mean, sigma, cap: `mean` is the
    uncapped distribution's and may exceed the cap, as when most answers run into the length limit) |
    empirical (lengths + counts: a histogram; or `file:` a CSV with columns length,count).
    RL response lengths are long-tailed and the tail decides step time, hence lognormal/empirical.
    """

    model_config = _FROZEN

    kind: Literal["fixed", "uniform", "lognormal", "empirical"]
    value: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    low: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    high: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    mean: float | None = Field(default=None, ge=1, le=MAX_TOKENS)
    sigma: float | None = Field(default=None, gt=0, le=5)
    cap: int | None = Field(default=None, ge=1, le=MAX_TOKENS)
    lengths: tuple[int, ...] | None = Field(default=None, min_length=1, max_length=100_000)
    counts: tuple[float, ...] | None = Field(default=None, min_length=1, max_length=100_000)

    @model_validator(mode="after")
    def _check(self) -> LengthDist:
        need = {
            "fixed": ("value",),
            "uniform": ("low", "high"),
            "lognormal": ("mean", "sigma", "cap"),
            "empirical": ("lengths", "counts"),
        }[self.kind]
        for field in need:
            if getattr(self, field) is None:
                raise ValueError(f"a {self.kind} length distribution needs '{field}'")
        if self.kind == "uniform" and self.low > self.high:  # type: ignore[operator]
            raise ValueError(f"uniform: low ({self.low}) must not exceed high ({self.high})")
        if self.kind == "empirical":
            assert self.lengths is not None and self.counts is not None
            if len(self.lengths) != len(self.counts):
                raise ValueError("empirical: lengths and counts must have the same number of entries")
            if any(x < 1 or x > MAX_TOKENS for x in self.lengths):
                raise ValueError(f"empirical: lengths must lie in 1..{MAX_TOKENS}")
            if any(c < 0 or not math.isfinite(c) for c in self.counts) or sum(self.counts) <= 0:
                raise ValueError("empirical: counts must be non-negative finite numbers, not all zero")
            if not math.isfinite(sum(self.counts)):  # 1e308 + 1e308: each finite, the total is not
                raise ValueError("empirical: counts sum to more than a float holds; scale them down")
        return self

    def _mu(self) -> float:
        assert self.mean is not None and self.sigma is not None
        return lognormal_mu(self.mean, self.sigma)

    @property
    def max(self) -> int:
        if self.kind == "fixed":
            return int(self.value)  # type: ignore[arg-type]
        if self.kind == "uniform":
            return int(self.high)  # type: ignore[arg-type]
        if self.kind == "lognormal":
            return int(self.cap)  # type: ignore[arg-type]
        return int(max(self.lengths))  # type: ignore[arg-type]

    def expected(self) -> float:
        """Mean length (capping included): worked out once per distribution, as the simulator's
        trainer asks at every step."""
        return _expected(self)

    def expected_square(self) -> float:
        """E[L^2], used for the mean context a sequence sees while it decodes."""
        samples = self.sample(np.random.default_rng(0), 20_000) if self.kind != "fixed" else None
        if samples is None:
            return float(self.value) ** 2  # type: ignore[operator]
        return float(np.mean(samples.astype(float) ** 2))

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """n integer lengths."""
        if self.kind == "fixed":
            return np.full(n, self.value, dtype=np.int64)
        if self.kind == "uniform":
            return rng.integers(self.low, self.high + 1, size=n)  # type: ignore[operator]
        if self.kind == "lognormal":
            raw = rng.lognormal(self._mu(), self.sigma, size=n)
            # in place: a fresh array of a million lengths costs more in page faults than the rounding
            np.rint(raw, out=raw)
            np.clip(raw, 1, self.cap, out=raw)
            return raw.astype(np.int64)
        return rng.choice(np.asarray(self.lengths, dtype=np.int64), size=n, p=self.probabilities())

    def probabilities(self) -> np.ndarray:
        """An empirical histogram's counts as probabilities. Scaled by the largest count first: counts
        near the float limits (1e308, or 1e-320 with few bits left) still give weights that sum to 1."""
        counts = np.asarray(self.counts, float)
        scaled = counts / counts.max()
        return scaled / scaled.sum()



@functools.lru_cache(maxsize=256)
def _expected(dist: LengthDist) -> float:
    if dist.kind == "fixed":
        return float(dist.value)  # type: ignore[arg-type]
    if dist.kind == "uniform":
        return (dist.low + dist.high) / 2  # type: ignore[operator]
    if dist.kind == "empirical":
        return float((np.asarray(dist.lengths, float) * dist.probabilities()).sum())
    return capped_lognormal_mean(float(dist.mean), float(dist.sigma), float(dist.cap))  # type: ignore[arg-type]


def lognormal_mu(mean: float, sigma: float) -> float:
    """The log-scale location whose *uncapped* lognormal mean is `mean`."""
    return math.log(mean) - sigma**2 / 2


def capped_lognormal_mean(mean: float, sigma: float, cap: float) -> float:
    """E[min(X, cap)] for a lognormal X of mean `mean` (uncapped) and log-scale sigma:
    exp(mu + s^2/2) Phi((ln c - mu - s^2)/s) + c (1 - Phi((ln c - mu)/s))."""
    mu = lognormal_mu(mean, sigma)
    z = (math.log(cap) - mu) / sigma
    return math.exp(mu + sigma * sigma / 2) * float(ndtr(z - sigma)) + cap * float(ndtr(-z))
