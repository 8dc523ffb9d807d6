"""On-policy (sync, colocated) rate of one engine handed n agentic episodes at once: their drain.

As planner.drain.drain_rates prices a one-shot batch of single-turn samples, the batch thins as
episodes finish; in between, an episode out on a tool call holds no slot (sim.tool_calls), so its
slot idles unless another episode decodes. The drain is stepped in time as a fluid: every decoding
episode gains dt / it(b) tokens a step, b the episodes of its batch decoding then, it(b) one decode
iteration at the episodes' mean decode context (planner.agentic_rate); a turn's end starts its tool
call (and the prefill of what the tool returns), whose end starts the next turn. Over seeded
episodes (traces.episodes, the simulator's own draws):

    D(n) = prefill of the n prompts + E[the time the last of the n finishes],    rate(n) = n / D(n).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from traces.episodes import Episodes
from traces.workload import Workload

STEPS = 256  # time steps over the longest drain: a turn's end is late by dt / 2 at most
EPISODES = 2048  # seeded episodes per load point (at least 4 batches), for the expected last finish
IterationSeconds = Callable[[np.ndarray], np.ndarray]  # decoding episodes -> one iteration's seconds
PrefillSeconds = Callable[[np.ndarray, np.ndarray], np.ndarray]  # (tokens, cached prefix) -> seconds


def drain_seconds(workload: Workload, points: np.ndarray, iteration: IterationSeconds, prefill: PrefillSeconds,
                  seed: int = 0) -> np.ndarray:
    """D(n) per load point n (the module docstring), from `iteration(b)` and `prefill(tokens)`."""
    assert workload.agentic is not None, "agentic workloads only"
    cohorts = np.maximum(4, EPISODES // np.maximum(points.astype(np.int64), 1))
    sizes = np.repeat(points.astype(np.int64), cohorts)  # one batch per (point, cohort)
    batch = np.repeat(np.arange(len(sizes)), sizes)  # each episode's batch
    rng = np.random.default_rng([seed, 3])
    ep = Episodes.draw(workload.agentic, workload.response_len, workload.response_len.sample(rng, len(batch)), seed)
    per_token = iteration(np.arange(1.0, points.max() + 1))  # [b - 1]: priced once, looked up per step
    decoded = np.add.reduceat(ep.answer, ep.first).astype(float)
    tools = np.add.reduceat(ep.tool_seconds, ep.first)
    returns = _return_seconds(workload, ep, prefill)
    # no batch can take longer than its episodes decoding at the slowest iteration one after another
    slowest = float(per_token.max())
    dt = float((decoded * slowest + tools + np.add.reduceat(returns, ep.first)).max()) / STEPS
    turn = np.zeros(len(batch), np.int64)
    left = ep.answer[ep.first].astype(float)  # tokens of the current turn still to decode
    away = np.zeros(len(batch))  # seconds left on the current tool call
    end = np.full(len(sizes), 0.0)
    done = np.zeros(len(batch), bool)
    t = 0.0
    while not done.all():
        t += dt
        decoding = ~done & (away <= 0)
        busy = np.bincount(batch[decoding], minlength=len(sizes))
        left[decoding] -= dt / per_token[np.maximum(busy, 1) - 1][batch[decoding]]
        away[~done & ~decoding] -= dt
        ended = decoding & (left <= 0)
        last = ended & (turn >= ep.turns - 1)
        done |= last
        np.maximum.at(end, batch[last], t)
        more = np.flatnonzero(ended & ~last)
        idx = ep.first[more] + turn[more]  # the turn just ended, its tool call now
        away[more] = ep.tool_seconds[idx] + returns[idx]
        turn[more] += 1
        left[more] = ep.answer[idx + 1]
    prompt = workload.prompt_len.expected()
    fill = prefill(points.astype(float) * prompt, np.zeros(len(points)))
    point = np.repeat(np.arange(len(points)), cohorts)
    return fill + np.bincount(point, weights=end) / cohorts


def _return_seconds(workload: Workload, ep: Episodes, prefill: PrefillSeconds) -> np.ndarray:
    """Per turn: the prefill when its tool result comes back (0 after the last turn), over the context
    so far as traces.episodes.Episodes.next_turn rules: cached (only the result is new) or not."""
    grown = ep.answer + ep.tool_tokens
    so_far = np.cumsum(grown)
    so_far = so_far - np.repeat(so_far[ep.first] - grown[ep.first], ep.turns)  # within each episode
    context = workload.prompt_len.expected() + so_far - ep.tool_tokens  # at the return, before the result
    tokens = ep.tool_tokens.astype(float) if ep.prefix_cache else context + ep.tool_tokens
    cached = context if ep.prefix_cache else np.zeros(len(context))
    return np.where(ep.tool_tokens > 0, prefill(np.maximum(tokens, 1.0), cached), 0.0)


def drain_rates(workload: Workload, points: np.ndarray, iteration: IterationSeconds, prefill: PrefillSeconds
                ) -> np.ndarray:
    """Episodes/s of one engine handed n (`points`) episodes at once: n / D(n)."""
    return points.astype(float) / drain_seconds(workload, points, iteration, prefill)
