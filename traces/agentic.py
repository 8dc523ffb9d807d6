"""Agentic, multi-turn rollouts: turns per episode, tool latency per turn, tokens each tool result adds.

An episode is `turns` model turns; between two turns the model's tool call (code execution, search, a
simulator) runs for `tool_latency` seconds and its result adds `tool_tokens` tokens to the context.
The workload's `response_len` is then the length of ONE turn's answer. One turn and no latency is
the single-turn workload exactly. (AReaL's and verl's multi-turn rollouts, e.g. verl's
`actor_rollout_ref.rollout.multi_turn`, keep the whole episode as one trained sequence.)
"""

from __future__ import annotations

import functools
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from traces.lengths import LengthDist, capped_lognormal_mean, lognormal_mu

_FROZEN = ConfigDict(frozen=True, extra="forbid")
MAX_SECONDS = 86_400.0  # a tool call longer than a day is a typo


class SecondsDist(BaseModel):
    """A latency distribution in seconds: fixed (value) | uniform (low..high) | lognormal (mean of the
    uncapped distribution, sigma, cap). Tool latencies are long-tailed (a sandbox that times out), hence
    the capped lognormal."""

    model_config = _FROZEN

    kind: Literal["fixed", "uniform", "lognormal"]
    value: float | None = Field(default=None, ge=0, le=MAX_SECONDS)
    low: float | None = Field(default=None, ge=0, le=MAX_SECONDS)
    high: float | None = Field(default=None, ge=0, le=MAX_SECONDS)
    mean: float | None = Field(default=None, gt=0, le=MAX_SECONDS)
    sigma: float | None = Field(default=None, gt=0, le=5)
    cap: float | None = Field(default=None, gt=0, le=MAX_SECONDS)

    @model_validator(mode="after")
    def _check(self) -> SecondsDist:
        need = {"fixed": ("value",), "uniform": ("low", "high"), "lognormal": ("mean", "sigma", "cap")}[self.kind]
        for field in need:
            if getattr(self, field) is None:
                raise ValueError(f"a {self.kind} latency distribution needs '{field}' (seconds)")
        if self.kind == "uniform" and self.low > self.high:  # type: ignore[operator]
            raise ValueError(f"uniform: low ({self.low}) must not exceed high ({self.high})")
        return self

    @property
    def max(self) -> float:
        return float({"fixed": self.value, "uniform": self.high, "lognormal": self.cap}[self.kind])  # type: ignore[arg-type]

    def expected(self) -> float:
        return _expected_seconds(self)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """n latencies in seconds (float64)."""
        if self.kind == "fixed":
            return np.full(n, float(self.value))  # type: ignore[arg-type]
        if self.kind == "uniform":
            return rng.uniform(self.low, self.high, size=n)  # type: ignore[arg-type]
        mu = lognormal_mu(self.mean, self.sigma)  # type: ignore[arg-type]
        return np.minimum(rng.lognormal(mu, self.sigma, size=n), self.cap)  # type: ignore[arg-type]


@functools.lru_cache(maxsize=64)
def _expected_seconds(dist: SecondsDist) -> float:
    if dist.kind == "fixed":
        return float(dist.value)  # type: ignore[arg-type]
    if dist.kind == "uniform":
        return (dist.low + dist.high) / 2  # type: ignore[operator]
    return capped_lognormal_mean(float(dist.mean), float(dist.sigma), float(dist.cap))  # type: ignore[arg-type]


_NO_LATENCY = SecondsDist(kind="fixed", value=0.0)
_ONE_TOKEN = LengthDist(kind="fixed", value=1)


class Agentic(BaseModel):
    """Multi-turn episodes. `turns` counts model turns (tool calls = turns - 1, none after the last)."""

    model_config = _FROZEN

    turns: LengthDist = Field(description="model turns per episode (a distribution of whole numbers >= 1)")
    tool_latency: SecondsDist = Field(default=_NO_LATENCY, description="seconds each tool call takes")
    tool_tokens: LengthDist = Field(default=_ONE_TOKEN, description="tokens each tool result adds to the context")
    prefix_cache: bool = Field(
        default=True, description="the engine keeps the episode's KV cache across turns (prefix caching); "
        "False: each turn re-prefills the whole context so far")

    @model_validator(mode="after")
    def _check(self) -> Agentic:
        if self.turns.max > 1024:
            raise ValueError(f"turns: at most 1024 turns per episode, got up to {self.turns.max}")
        return self

    @property
    def max_tool_calls(self) -> int:
        return self.turns.max - 1

    def expected_tool_calls(self) -> float:
        return self.turns.expected() - 1.0

    def max_context(self, prompt: LengthDist, response: LengthDist) -> int:
        """The longest episode: prompt, every turn's answer at its cap and every tool result at its cap."""
        return prompt.max + self.turns.max * response.max + self.max_tool_calls * self.tool_tokens.max

    def expected_tokens(self, prompt: LengthDist, response: LengthDist) -> float:
        """Mean tokens of one episode (turn count independent of the lengths, Wald's identity)."""
        return (prompt.expected() + self.turns.expected() * response.expected()
                + self.expected_tool_calls() * self.tool_tokens.expected())

    # ---- episode means for the planner's analytic rate (planner.agentic_rate) -------------------
    def _turn_pairs(self) -> float:
        """E[T (T - 1)] / 2: the pairs of turns (t' < t) of an episode, each adding a turn's answer
        and tool result to the later one's context."""
        return (self.turns.expected_square() - self.turns.expected()) / 2

    def decode_context(self, prompt: LengthDist, response: LengthDist) -> float:
        """Mean context of a decoding turn, weighted by its decode iterations: the prompt, the earlier
        turns' answers and tool results (E[T (T-1)] / (2 E[T]) of them per turn, on average), and
        E[o^2] / (2 E[o]) of its own answer so far (as traces.costmodel's generation_rate)."""
        earlier = self._turn_pairs() / self.turns.expected() * (response.expected() + self.tool_tokens.expected())
        return prompt.expected() + earlier + response.expected_square() / (2 * response.expected())

    def prefill_tokens(self, prompt: LengthDist, response: LengthDist) -> float:
        """Mean tokens an episode prefills: its prompt, then at each tool call's return its result
        (prefix cache) or its whole context so far, E[T-1] E[p] + E[T(T-1)/2] (E[o] + E[u])."""
        calls = self.expected_tool_calls()
        if self.prefix_cache:
            return prompt.expected() + calls * self.tool_tokens.expected()
        grown = self._turn_pairs() * (response.expected() + self.tool_tokens.expected())
        return prompt.expected() * (1 + calls) + grown

    def return_prefix(self, prompt: LengthDist, response: LengthDist) -> float:
        """Mean context cached when a tool result comes back (prefix caching): the prompt, the m turns'
        answers and m - 1 tool results before it, m = E[T (T-1) / 2] / E[T - 1] turns on average."""
        calls = self.expected_tool_calls()
        if calls <= 0:
            return 0.0
        m = self._turn_pairs() / calls
        return prompt.expected() + m * response.expected() + (m - 1) * self.tool_tokens.expected()

    def wait_seconds(self) -> float:
        """Mean seconds an episode spends out on tool calls (holding no slot)."""
        return self.expected_tool_calls() * self.tool_latency.expected()
