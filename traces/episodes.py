"""Agentic episodes drawn up front, and the rules both simulators apply between two turns.

An episode (traces.agentic) is `turns` model turns; after every turn but the last its tool call runs
for a drawn latency and adds a drawn number of tokens to the context. Both simulators (the fast path
and the token-level reference) read the same draws and the same rules from here, so they agree by
construction on what an episode is, and differ only in how they step time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from traces.agentic import Agentic
from traces.lengths import LengthDist


@dataclass(frozen=True)
class Episodes:
    """Per sample: its turns and where they start in the per-turn arrays; per turn: the answer's
    tokens, the tokens its tool result adds and the tool call's seconds (both 0 after the last turn)."""

    turns: np.ndarray  # [sample]
    first: np.ndarray  # [sample]: index of its first turn
    answer: np.ndarray  # [turn]
    tool_tokens: np.ndarray  # [turn]
    tool_seconds: np.ndarray  # [turn]
    prefix_cache: bool

    @classmethod
    def draw(cls, agentic: Agentic, response_len: LengthDist, first_answers: np.ndarray, seed: int) -> Episodes:
        """The episodes of len(first_answers) samples whose first answers are drawn already (with the
        prompts, as for a single-turn workload: one turn and no latency then simulates exactly like it).
        The rest comes from a stream of its own, so adding turns does not move the first draws."""
        rng = np.random.default_rng([seed, 2])
        n = len(first_answers)
        turns = np.maximum(agentic.turns.sample(rng, n), 1).astype(np.int64)
        first = np.cumsum(turns) - turns
        total = int(turns.sum())
        answer = np.empty(total, np.int64)
        later = np.ones(total, bool)
        later[first] = False
        answer[first] = first_answers
        answer[later] = response_len.sample(rng, total - n)
        tool_tokens = agentic.tool_tokens.sample(rng, total).astype(np.int64)
        tool_seconds = agentic.tool_latency.sample(rng, total).astype(np.float64)
        last = first + turns - 1
        tool_tokens[last], tool_seconds[last] = 0, 0.0
        return cls(turns, first, answer, tool_tokens, tool_seconds, agentic.prefix_cache)

    def is_last(self, sids: np.ndarray, turn: np.ndarray) -> np.ndarray:
        """Whether turn `turn` (0-based) of each sample is its episode's last (it then goes to the trainer)."""
        return turn >= self.turns[sids] - 1

    def latency(self, sids: np.ndarray, turn: np.ndarray) -> np.ndarray:
        """Seconds the tool call after turn `turn` takes."""
        return self.tool_seconds[self.first[sids] + turn]

    def next_turn(self, sids: np.ndarray, turn: np.ndarray, context: np.ndarray, same_weights: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A sample back from the tool call after turn `turn`, its `context` (prompt and answers and
        tool results so far) held until then: its new context (the tool result appended), its next
        answer, and the tokens of that context its engine need not prefill again.

        With prefix caching the engine still holds the context's KV blocks (vLLM keeps a finished
        request's blocks in its prefix cache until they are evicted; we assume they are not) and
        prefills only the tool result, unless it loaded new weights since: the cached KV was made by
        the old ones (vLLM resets its prefix cache at a weight update). Without it, everything again.
        """
        idx = self.first[sids] + turn
        grown = context + self.tool_tokens[idx]
        cached = np.where(same_weights, context, 0) if self.prefix_cache else np.zeros(len(sids), np.int64)
        return grown, self.answer[idx + 1], cached.astype(np.int64)
