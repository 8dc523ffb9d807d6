"""The analytic rate of one engine running agentic episodes (traces.agentic), for the MILP's curves.

An episode holds a batch slot only while one of its turns decodes (the simulator releases it during
each tool call: sim.tool_calls). At a decode batch of b busy slots an engine completes
r(b) = 1 / (prefill seconds + E[T] E[o] it(b) / b) episodes/s, it(b) one iteration at the episodes'
mean decode context (their contexts grow turn by turn). By Little's law on the slots the episodes
it must hold in flight to keep b slots busy are L(b) = b + r(b) W, W the mean seconds an episode
spends out on tool calls: the curve the MILP spreads in-flight samples over is (L(b), r(b)).
The staleness rule waits for a cohort's longest episode in wall time, decode plus tool waits: the
expected max of n such sums comes from seeded draws of whole episodes (mean_over_max_latency).
"""

from __future__ import annotations

import numpy as np

from planner import episode_drain
from traces import CostModel, GpuType, Workload
from traces.agentic import Agentic
from traces.episodes import Episodes


def _agentic(workload: Workload) -> Agentic:
    assert workload.agentic is not None, "agentic workloads only"
    return workload.agentic


def decode_context(workload: Workload) -> float:
    """Mean context of a decoding turn (traces.agentic.Agentic.decode_context)."""
    return _agentic(workload).decode_context(workload.prompt_len, workload.response_len)


def full_batch(cm: CostModel, gpu: GpuType, workload: Workload, tp: int, ep: int = 1) -> int:
    """Turns an engine's KV cache runs at once at the mean decode context (capped by max_num_seqs)."""
    return int(cm.max_batch(gpu, workload.model, tp, decode_context(workload), ep))


def episode_rates(cm: CostModel, gpu: GpuType, workload: Workload, tp: int, points: np.ndarray, ep: int = 1
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(episodes in flight L(b), episodes/s r(b)) at the decode batches b = `points`."""
    a = _agentic(workload)
    model, b = workload.model, np.maximum(points.astype(float), 1.0)
    context = decode_context(workload)
    it = np.asarray(cm.decode(gpu, model, tp, b, context, ep).seconds, float)
    # the prompt priced per token at a chunk of prompts, as traces.costmodel's generation_rate does;
    # each tool result comes back on its own (at its own time), so it is a prefill pass of its own
    prompt = workload.prompt_len.expected()
    per_chunk = max(1, int(cm.efficiency.prefill_chunk_tokens // max(prompt, 1)))
    chunk = prompt * per_chunk
    first = float(cm.prefill(gpu, model, tp, chunk, prompt, ep).seconds) / per_chunk
    calls = a.expected_tool_calls()
    per_call = (a.prefill_tokens(workload.prompt_len, workload.response_len) - prompt) / max(calls, 1e-9)
    # a returning tool result attends to the episode's cached context too (prefix caching)
    cached = a.return_prefix(workload.prompt_len, workload.response_len) if a.prefix_cache else 0.0
    again = float(cm.prefill(gpu, model, tp, max(per_call, 1.0), max(per_call, 1.0), ep, cached).seconds
                  ) if calls > 0 else 0.0
    prefill_s = first + calls * again
    decoded = a.turns.expected() * workload.response_len.expected()
    rate = 1.0 / (prefill_s + decoded * it / b)
    return b + rate * a.wait_seconds(), rate


def on_policy_rates(cm: CostModel, gpu: GpuType, workload: Workload, tp: int, points: np.ndarray, ep: int = 1
                    ) -> np.ndarray:
    """Episodes/s of one engine handed n (`points`) episodes at once (planner.episode_drain)."""
    model, context = workload.model, decode_context(workload)

    def iteration(busy: np.ndarray) -> np.ndarray:
        return np.asarray(cm.decode(gpu, model, tp, busy, context, ep).seconds, float)

    def prefill(tokens: np.ndarray, cached: np.ndarray) -> np.ndarray:
        return np.asarray(cm.prefill(gpu, model, tp, tokens, tokens, ep, cached).seconds, float)

    return episode_drain.drain_rates(workload, points, iteration, prefill)


def longest_episode_seconds(cm: CostModel, gpu: GpuType, workload: Workload, tp: int, ep: int = 1) -> float:
    """The expected longest episode of a step's batch in wall time, its decode priced alone at the
    mean decode context: the staleness rule's floor. The max is over whole episodes (decode plus
    tool waits drawn together, as mean_over_max_latency), not the sum of each part's max."""
    per_iter = float(cm.decode(gpu, workload.model, tp, 1, decode_context(workload), ep).seconds)
    prefill = float(cm.prefill(gpu, workload.model, tp, workload.prompt_len.expected(), None, ep).seconds)
    return prefill + _expected_longest_latency(workload, workload.samples_per_step, per_iter)


def _expected_longest_latency(workload: Workload, cohort: int, seconds_per_token: float, cohorts: int = 16
                              ) -> float:
    decoded, tools = _episode_draws(workload, cohort * cohorts)
    return float((decoded * seconds_per_token + tools).reshape(cohorts, cohort).max(axis=1).mean())


def _episode_draws(workload: Workload, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(tokens decoded, seconds out on tool calls) of n seeded episodes (traces.episodes: the simulator's draws)."""
    rng = np.random.default_rng([seed, 3])
    ep = Episodes.draw(_agentic(workload), workload.response_len, workload.response_len.sample(rng, n), seed)
    return np.add.reduceat(ep.answer, ep.first), np.add.reduceat(ep.tool_seconds, ep.first)


def tail_seconds_per_token(cm: CostModel, gpu: GpuType, workload: Workload, tp: int, full: int, ep: int = 1
                           ) -> float:
    """Wall seconds per decoded token of an episode on an engine that the staleness cap holds below its
    full batch (the only case where the cohort tail binds): one decode iteration at the batch b where
    b / it(b) is half its full-batch value, the knee of the engine's throughput curve."""
    context = decode_context(workload)
    batches = np.arange(1, max(full, 1) + 1, dtype=float)
    it = np.asarray(cm.decode(gpu, workload.model, tp, batches, context, ep).seconds, float)
    per_s = batches / it
    knee = int(np.searchsorted(per_s, per_s[-1] / 2))
    return float(it[min(knee, len(it) - 1)])


def mean_over_max_latency(workload: Workload, cohort: int, seconds_per_token: float, cohorts: int = 16) -> float:
    """E[latency] / E[longest latency of a cohort] in wall time, an episode's latency being its decode
    (tokens x `seconds_per_token`) plus its tool waits, the sum drawn per episode: the expected max of
    n sums is taken from seeded draws of whole episodes, not from the per-part maxima."""
    decoded, tools = _episode_draws(workload, cohort * cohorts)
    mean = float((decoded * seconds_per_token + tools).mean())
    return mean / _expected_longest_latency(workload, cohort, seconds_per_token, cohorts)
