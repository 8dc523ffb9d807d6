"""Agentic episodes on the fast path: a turn that ends in a tool call leaves its engine, and comes back.

A sample is an episode (traces.episodes). Engines file the completions their decode plans will make
(sim.controller); a completion that ends a turn with a tool call after it is filed here instead of
with the trainer's buffer, due when the tool call returns. Until then the sample holds no batch slot
and no KV (with prefix caching its blocks stay in vLLM's prefix cache, evictable, so they do not
hold admission back: traces.episodes.Episodes.next_turn). When it is due it comes back to the engine
it was routed to (the one that caches its prefix) with its grown context, as a routed request:
the engine serves others meanwhile. Its start version never changes, so the staleness rule counts
an episode by its first token's version (AReaL's rule). Filings here are parts numbered as the
controller's pool numbers them (a part is one decode plan), so a decode plan cut short is cut here too.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import simpy

from sim.clock import Alarm
from sim.completion_pool import CompletionPool
from sim.decode_plans import FlatDecodePlans
from sim.samples import Samples
from traces.episodes import Episodes


class Homes(Protocol):
    """Where episodes come back to (sim.fleet.Fleet)."""

    def assign(self, engine: np.ndarray, sids: np.ndarray) -> None: ...
    def same_weights(self, engine: np.ndarray, version: np.ndarray) -> np.ndarray: ...


class ToolCalls:
    """Episodes out on a tool call: filed ahead (and cut back) as completions are, sent home when due."""

    def __init__(self, env: simpy.Environment, samples: Samples, episodes: Episodes, reward_seconds: float) -> None:
        assert samples.cached is not None and samples.home is not None, "Samples(..., episodes=True)"
        self.env, self.samples, self.episodes = env, samples, episodes
        self.reward_seconds = reward_seconds  # in the filed times of a last turn only; taken out of the others
        n = len(samples)
        self.turn = np.zeros(n, np.int64)  # [sample]: the turn it is on (0-based)
        self.left_version = np.zeros(n, np.int64)  # [sample]: its engine's weights when its last turn ended
        self.pool = CompletionPool(samples.start_version)
        self.homes: Homes | None = None  # the fleet, once it is made
        self._returns = Alarm(env, lambda: self.pool.kth_time({}), self._back)  # tool calls due back

    def last_turn(self, sids: np.ndarray) -> np.ndarray:
        """Whether each sample is on its episode's last turn (its completion goes to the trainer)."""
        return self.episodes.is_last(sids, self.turn[sids])

    def file(self, times: np.ndarray, sids: np.ndarray, owner: np.ndarray, ranks: np.ndarray, n: int,
             version: np.ndarray) -> int:
        """Turns ending in a tool call at `times` (with the reward latency in), entry i number ranks[i]
        of part owner[i] of n parts, by engines running weights `version`: back when their tool calls
        return. The first part's id (the same as the controller's pool gives this filing)."""
        back = times - self.reward_seconds + self.episodes.latency(sids, self.turn[sids])
        first = self.pool.file_parts(back, sids, owner, ranks, n)
        self.left_version[sids] = version
        self._arm_soon()
        return first

    def cut(self, part: int, keep: int) -> None:
        self.pool.cut(part, keep)
        self._arm_soon()

    def cut_parts(self, parts: np.ndarray, keep: np.ndarray) -> None:
        self.pool.cut_parts(parts, keep)
        self._arm_soon()

    def _arm_soon(self) -> None:
        """Filings changed: set the return timer at the end of this instant (once for many engines)."""
        self._returns.soon()

    def _back(self) -> None:
        """The tool calls due by now return: each episode's next turn is routed to its engine."""
        sids, _, _ = self.pool.due(self.env.now)
        if not len(sids):
            return
        assert self.homes is not None
        sids = np.sort(sids)
        s, turn = self.samples, self.turn[sids]
        home = s.home[sids]  # type: ignore[index]
        same = self.homes.same_weights(home, self.left_version[sids])
        grown, answer, cached = self.episodes.next_turn(sids, turn, s.exit_tokens[sids], same)
        self.turn[sids] = turn + 1
        s.prompt[sids], s.response[sids], s.exit_tokens[sids] = grown, answer, grown + answer
        s.generated[sids] = 0  # of this turn's answer (the tokens before are in the context now)
        s.cached[sids] = cached  # type: ignore[index]
        self.homes.assign(home, sids)


def plan_entries(plans: FlatDecodePlans, reward: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """What n engines' decode plans complete, as the entries CompletionPool.file_plans files: times
    (jump end plus the engine's reward latency), sample ids, owner engine and rank in its part."""
    engines = len(plans.n_done)
    jump_owner = np.repeat(np.arange(engines), np.diff(plans.jumps))
    times = np.repeat(plans.ends + np.asarray(reward, np.float64)[jump_owner], plans.done)
    owner = np.repeat(np.arange(engines), plans.n_done)
    ranks = np.arange(len(owner)) - np.repeat(np.cumsum(plans.n_done) - plans.n_done, plans.n_done)
    sids = plans.sid[plans.rows[:-1][owner] + ranks]
    assert len(times) == len(sids)
    return times, sids, owner, ranks
