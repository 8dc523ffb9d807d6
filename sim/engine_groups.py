"""Engines that go through a step together, as arrays: no simpy process runs for them meanwhile.

In steady state every engine of an async fleet does the same things at the same instants: the
trainer pushes new weights, every engine stops after its current iteration, loads the weights at
the same time as the others, re-prefills, admits what the router sends it, and decodes its batch
in closed form until the next push, with nothing to decide in between (quiet: no staleness
allowance left to route). `Parked` holds such engines' decode plans side by side
(sim.decode_plans.FlatDecodePlans) and `Loading` the engines between a push and their weight load;
sim.parking moves them through the cycle with a few array passes per step
(sim.kernels.fleet_passes), where the per-engine path would resume one process per engine several
times a step. An engine leaves the arrays (Parking.unpark) as soon as something happens to it
alone, and carries on in its own process exactly as if it had never left.

Things that happen inside a decode plan without a decision (the prefills admitting the routed samples,
jumps and completions) are recorded when they are next looked at: at the next push, when the
engine leaves, or at the end of the run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from sim.decode_plans import FlatDecodePlans
from sim.kernels.owners import group_by_owner


@dataclass(slots=True)
class Parked:
    """Engines that laid out their decode plans at one instant and sleep through them (local index i)."""

    engines: np.ndarray  # fleet index of each
    alive: np.ndarray  # still parked here (an engine that leaves does not come back to this one)
    version: np.ndarray
    progress: np.ndarray  # decode iterations when the decode plan starts
    context_pre: np.ndarray  # KV context before the admission
    context: np.ndarray  # and after it (the decode plan's)
    seg_start: np.ndarray  # when the engine decided (sim.segment)
    reprefill_end: np.ndarray  # nan: no re-prefill
    prefill_end: np.ndarray  # nan: nothing admitted
    n_pre: np.ndarray  # samples running before the admission
    n_new: np.ndarray  # samples admitted
    phases_open: np.ndarray  # its prefills are not recorded yet
    is_new: np.ndarray  # per row of the plan: admitted at this instant
    rest: np.ndarray  # samples left in the inbox (no room for them)
    idle_end: np.ndarray  # its decode plan drains the batch and nothing waits: the engine is idle after it
    plans: FlatDecodePlans
    t0: np.ndarray  # decode starts (after the prefills)
    first_part: int  # the completions of engine i are part first_part + i of the controller's index

    def completed_by(self, i: int, now: float) -> int:
        """Samples of engine i whose jump has ended by now."""
        p = self.plans
        lo, hi = int(p.jumps[i]), int(p.jumps[i + 1])
        j = int(p.ends[lo:hi].searchsorted(now, "right"))
        return int(p.cum[lo + j - 1] - p.offsets[i]) if j else 0


@dataclass(slots=True)
class Loading:
    """Engines stopped for a weight push, waiting for the weights (local index i)."""

    engines: np.ndarray  # fleet index of each
    version: np.ndarray
    progress: np.ndarray
    context: np.ndarray
    start: np.ndarray  # since when each waits
    owner: np.ndarray  # running samples: local engine, sorted by (engine, finish, sid)
    sid: np.ndarray
    fin: np.ndarray
    joined: np.ndarray
    count: np.ndarray  # running samples of each
    # routed to them once loaded (the router's sends, in order): local engine and sample ids
    _in_owner: list[np.ndarray] = field(default_factory=list)
    _in_sid: list[np.ndarray] = field(default_factory=list)
    inbox_count: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    def __post_init__(self) -> None:
        self.inbox_count = np.zeros(len(self.engines), np.int64)

    def route(self, owner: np.ndarray, sids: np.ndarray) -> None:
        self._in_owner.append(owner)
        self._in_sid.append(sids)
        self.inbox_count += np.bincount(owner, minlength=len(self.engines))

    def inbox(self) -> tuple[np.ndarray, np.ndarray]:
        """Everything routed to them: (local engine, sample id), by engine, each in the order sent."""
        if not self._in_sid:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        owner, sid = np.concatenate(self._in_owner), np.concatenate(self._in_sid)
        return group_by_owner(owner, sid, len(self.engines))

    def subset(self, keep: np.ndarray) -> Loading:
        """The engines where keep[i] (renumbered)."""
        idx = np.flatnonzero(keep)
        renumber = np.cumsum(keep) - 1
        rows = keep[self.owner]
        out = Loading(self.engines[idx], self.version[idx], self.progress[idx],
                      self.context[idx], self.start[idx], renumber[self.owner[rows]], self.sid[rows],
                      self.fin[rows], self.joined[rows], self.count[idx])
        in_owner, in_sid = self.inbox()  # routed to them already (an episode back from a tool call)
        if len(in_sid) and keep[in_owner].any():
            mine = keep[in_owner]
            out.route(renumber[in_owner[mine]], in_sid[mine])
        return out

