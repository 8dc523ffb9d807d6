"""vLLM-style recompute preemption of one engine's batch (sim.engine.Engine._preempt).

The engine used to take its victims one at a time, a lexsort of the batch per victim; a batch that
loses hundreds of samples at once (KV-heavy plans) spent most of a planner's simulation there.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def preempt(sid: np.ndarray, joined: np.ndarray, progress: int, context: float, kv_tokens: float,
            prompt: np.ndarray, generated: np.ndarray, cached: np.ndarray, has_cached: bool
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
    """While `context` overflows `kv_tokens` and more than one sample runs, the newest (highest
    `joined`, then highest `sid`) leaves: its tokens since it joined are added to `generated`, its
    whole context (prompt + generated) leaves the cache, and its prefix cache is dropped (`cached`,
    when `has_cached`). Returns which rows stay, the victims' ids and tokens in the order they left,
    and the context after.

    The victims are a suffix of the batch's lexsort by (joined, sid): removing the last of a stable
    order leaves the rest in that order, so one sort gives the same victims as a lexsort each. The
    context is a float minus integers, one at a time, as the loop it replaces subtracted them."""
    n = len(sid)
    keep = np.ones(n, np.bool_)
    victims, tokens = np.empty(n, np.int64), np.empty(n, np.int64)
    order = np.empty(0, np.int64)
    m = 0
    while context > kv_tokens and n - m > 1:
        if m == 0:  # most overflows lose one sample: a scan finds it, no sort needed
            i = 0
            for r in range(1, n):
                if joined[r] > joined[i] or (joined[r] == joined[i] and sid[r] >= sid[i]):
                    i = r  # `>=`: of equal keys lexsort puts the last row last
        else:
            if m == 1:  # np.lexsort((sid, joined)): by sid, then stably by joined
                order = np.argsort(sid, kind="mergesort")
                order = order[np.argsort(joined[order], kind="mergesort")]
            i = order[n - 1 - m]
        s = sid[i]
        t = progress - joined[i]
        generated[s] += t
        context -= prompt[s] + generated[s]
        if has_cached:
            cached[s] = 0
        keep[i] = False
        victims[m], tokens[m] = s, t
        m += 1
    return keep, victims[:m], tokens[:m], context
