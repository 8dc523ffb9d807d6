"""Prefill seconds interpolated on a log-log grid (sim.decode_tables.PrefillCurve)."""

from __future__ import annotations

import math

import numpy as np
from numba import njit


@njit(cache=True)
def prefill_one(log_tokens: np.ndarray, log_seconds: np.ndarray, tokens: float) -> float:
    """sim.decode_tables.PrefillCurve: seconds to prefill `tokens`, interpolated on the log-log grid
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
