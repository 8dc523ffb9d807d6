"""Multi-turn episodes: a sample leaves its engine for each tool call and comes back with a longer context.

A workload with `agentic` set (traces.agentic) runs every sample as an episode of up to
`turns.max` model turns. When a turn's text holds a tool call (runtime.calculator_tool), the sample
leaves the engine's batch, as the simulator releases its slot: the call runs in a worker thread
that sleeps the workload's `tool_latency` (drawn per call from a generator seeded by the run's seed,
the sample id and the turn, so a rerun draws the same latencies) and then computes the tool's
answer. Meanwhile the engine serves other requests; the controller (runtime.controller) re-routes
the sample once the call is back, as a new request whose prompt is the whole episode so far (the
torch engine re-prefills it, having no prefix cache; a vLLM engine's prefix cache may serve it).
The episode ends at a turn with no call, at `turns.max` turns, or where the next turn would pass
the model's context (the call's answer is then not appended).

The episode is trained as one sequence (verl's and AReaL's multi-turn rollouts): the prompt, then
every turn's tokens and every tool result's, with `generated` False on the tool's tokens, which the
trainer masks out of the loss (runtime.trainer.pack): the policy did not sample them. Its reward is
the task's on the last turn's text. Each call is a `ToolCall` record (sample, turn, start, end: the
sample leaving its engine, the result ready), which the run's records keep (runtime.records).

The workload's `tool_tokens` and `turns` distributions are the simulator's assumptions; here they are
what the model and the tool produce. Its `prefix_cache` is the engine's own (runtime.run_plan says so).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

import numpy as np
from transformers import PretrainedConfig

from runtime.calculator_tool import CalculatorTool
from runtime.contracts import Tokenizer
from runtime.engine import Completion, Request
from traces.agentic import Agentic, SecondsDist

MAX_TOOL_WORKERS = 256  # calls in flight at once: each only sleeps, so threads are cheap


@dataclass(frozen=True)
class AgenticRun:
    """What of a workload's `agentic` block a run executes."""

    max_turns: int
    latency: SecondsDist
    seed: int = 0
    max_context: int | None = None  # the model's positions; None: no limit

    @classmethod
    def of(cls, agentic: Agentic, seed: int = 0, max_context: int | None = None) -> AgenticRun:
        return cls(agentic.turns.max, agentic.tool_latency, seed, max_context)

    def latency_s(self, sid: int, turn: int) -> float:
        """The seconds call `turn` of sample `sid` takes (seeded by the run, the sample and the turn)."""
        return float(self.latency.sample(np.random.default_rng((self.seed, sid, turn)), 1)[0])


def agentic_run(agentic: Agentic | None, seed: int, config: PretrainedConfig) -> AgenticRun | None:
    """A run's episodes for `agentic` (None: single-turn), bounded by the model's positions."""
    if agentic is None:
        return None
    positions = getattr(config, "max_position_embeddings", None)
    return AgenticRun.of(agentic, seed, positions if isinstance(positions, int) else None)


@dataclass(frozen=True)
class ToolCall:
    sample: int
    turn: int  # the model turn that made the call (1 = the first)
    start: float  # the sample left its engine
    end: float  # the tool's answer was ready
    latency: float  # the sampled seconds it slept
    version: int  # the weights' version when it left
    expression: str
    result: str


@dataclass
class _Episode:
    """One sample's episode so far (mutable, private to Episodes)."""

    prompt: tuple[int, ...]
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    generated: list[bool] = field(default_factory=list)
    turns: int = 0

    def context(self) -> tuple[int, ...]:
        return (*self.prompt, *self.tokens)

    def add(self, tokens: tuple[int, ...], logprobs: tuple[float, ...], versions: tuple[int, ...],
            generated: bool) -> None:
        self.tokens.extend(tokens)
        self.logprobs.extend(logprobs)
        self.versions.extend(versions)
        self.generated.extend([generated] * len(tokens))

    def completion(self, sid: int, finished: bool) -> Completion:
        mask = () if all(self.generated) else tuple(self.generated)  # one turn: exactly the single-turn sample
        return Completion(sid, self.prompt, tuple(self.tokens), tuple(self.logprobs), tuple(self.versions),
                          finished, mask)


@dataclass(frozen=True)
class _Pending:
    sid: int
    turn: int
    start: float
    latency: float
    version: int
    expression: str
    finished: bool  # the calling turn ended with eos


def final_turn(c: Completion) -> tuple[int, ...]:
    """The episode's last turn: the tokens after its last tool result (all of them for one turn)."""
    if not c.generated:
        return c.tokens
    last_tool = max((i for i, g in enumerate(c.generated) if not g), default=-1)
    return c.tokens[last_tool + 1:]


class Episodes:
    """The episodes of a run's samples between their turns, and the tool calls in flight."""

    def __init__(self, run: AgenticRun, tokenizer: Tokenizer, max_new_tokens: int,
                 clock: Callable[[], float], tool: CalculatorTool | None = None) -> None:
        self.run, self.tokenizer, self.max_new_tokens, self.clock = run, tokenizer, max_new_tokens, clock
        self.tool = tool or CalculatorTool()
        self._open: dict[int, _Episode] = {}
        self._calls: dict[Future[tuple[str, float]], _Pending] = {}
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=MAX_TOOL_WORKERS, thread_name_prefix="tool")

    def turn_done(self, c: Completion, version: int) -> Completion | None:
        """A turn of sample `c.sid` is in: its finished episode, or None if a tool call now runs for it."""
        episode = self._open.setdefault(c.sid, _Episode(c.prompt))
        episode.add(c.tokens, c.logprobs, c.versions, generated=True)
        episode.turns += 1
        expression = self.tool.find_call(self.tokenizer.decode(c.tokens))
        if expression is None or episode.turns >= self.run.max_turns:
            return self._end(c.sid, c.finished)
        latency = self.run.latency_s(c.sid, episode.turns)
        call = _Pending(c.sid, episode.turns, self.clock(), latency, version, expression, c.finished)
        self._calls[self._pool.submit(self._call, expression, latency)] = call
        return None

    def collect(self) -> tuple[list[Request], list[Completion], list[ToolCall]]:
        """Calls that are back: (next turns to route, episodes that ended at the context limit, the calls)."""
        resumed: list[Request] = []
        ended: list[Completion] = []
        calls: list[ToolCall] = []
        for future in [f for f in self._calls if f.done()]:
            call = self._calls.pop(future)
            result, end = future.result()
            calls.append(ToolCall(call.sid, call.turn, call.start, end, call.latency, call.version, call.expression,
                                  result))
            episode = self._open[call.sid]
            ids = self.tokenizer.encode(result)
            limit = self.run.max_context
            if limit is not None and len(episode.context()) + len(ids) + self.max_new_tokens > limit:
                ended.append(self._end(call.sid, call.finished))
                continue
            episode.add(tuple(ids), (0.0,) * len(ids), (call.version,) * len(ids), generated=False)
            resumed.append(Request(call.sid, episode.context(), self.max_new_tokens))
        return resumed, ended, calls

    def in_flight(self) -> int:
        return len(self._calls)

    def wait(self, timeout_s: float) -> None:
        """Block until a call is back (or `timeout_s`): what a loop does when only tools have work."""
        if self._calls:
            wait(list(self._calls), timeout=timeout_s, return_when=FIRST_COMPLETED)

    def discard(self, sid: int) -> None:
        """Forget sample `sid`'s episode (it is generated again from its prompt)."""
        self._open.pop(sid, None)

    def close(self) -> None:
        """Wake every sleeping call and stop the workers (a run that has its steps leaves calls unfinished)."""
        self._stop.set()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _end(self, sid: int, finished: bool) -> Completion:
        return self._open.pop(sid).completion(sid, finished)

    def _call(self, expression: str, latency: float) -> tuple[str, float]:
        """The tool call: the sampled latency slept (cut short only by `close`), then the answer."""
        self._stop.wait(latency)
        return self.tool.result_text(expression), self.clock()
