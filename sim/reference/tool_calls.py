"""The reference's agentic episodes: a turn that ends in a tool call leaves its engine for one
simpy timeout of the tool's latency, then comes back to it as a routed request with its grown
context (the draws and rules of traces.episodes, as the fast path's sim.tool_calls)."""

from __future__ import annotations

from typing import Protocol

import numpy as np
import simpy

from sim.reference.sample import Sample
from traces.episodes import Episodes


class Home(Protocol):
    """The engine an episode runs on (sim.reference.engine.Engine)."""

    version: int
    update: tuple[int, float] | None

    def assign(self, samples: list[Sample]) -> None: ...


class ToolCalls:
    def __init__(self, env: simpy.Environment, episodes: Episodes) -> None:
        self.env, self.episodes = env, episodes

    def leave(self, engine: Home, done: list[Sample]) -> list[Sample]:
        """Of the samples that finished a turn on `engine` now, those whose episode ends (to the
        trainer); the others wait on their tool call, then come back to it."""
        ends = []
        for s in done:
            sid, turn = np.array([s.sid]), np.array([s.turn])
            if self.episodes.is_last(sid, turn)[0]:
                ends.append(s)
                continue
            latency = float(self.episodes.latency(sid, turn)[0])
            self.env.timeout(latency).callbacks.append(
                lambda _ev, s=s, v=engine.version: self._back(engine, s, v))
        return ends

    def _back(self, engine: Home, s: Sample, version: int) -> None:
        same = np.array([engine.version == version and engine.update is None])
        grown, answer, cached = self.episodes.next_turn(np.array([s.sid]), np.array([s.turn]),
                                                        np.array([s.prompt + s.response]), same)
        s.prompt, s.response, s.cached = int(grown[0]), int(answer[0]), int(cached[0])
        s.turn += 1
        s.generated = 0  # of this turn's answer (the tokens before are in the context now)
        engine.assign([s])
