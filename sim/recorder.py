"""What the simulation saw: timeline intervals and time series.

Intervals come one at a time (`interval`) or, from a laid-out run of decode jumps, as arrays
(`intervals`); the timeline is put together, in order of end time, only when someone asks.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

import numpy as np

from sim.kernels.tallies import add_busy
from traces import SpecError

MAX_EVENTS = 20_000_000  # a bound on any one simulation, so bad input cannot hang it
MAX_WALL_SECONDS = 600.0  # and a bound on its wall time, checked every few thousand events

Row = tuple[str, str, str, float, float, int, int]


@dataclass
class Recorder:
    timeline: list[Row] = field(default_factory=list)
    queue: list[tuple[float, int, int, int]] = field(default_factory=list)  # time, waiting, in flight, buffered
    staleness_tokens: Counter[int] = field(default_factory=Counter)
    step_ends: list[float] = field(default_factory=list)
    step_samples: list[int] = field(default_factory=list)
    step_tokens: list[int] = field(default_factory=list)
    trained: list[np.ndarray] = field(default_factory=list)  # the ids each step trained
    events: int = 0
    deadline: float = field(default_factory=lambda: time.monotonic() + MAX_WALL_SECONDS)
    wall_seconds: float = MAX_WALL_SECONDS  # the bound `deadline` stands for (the message names it)
    _next_clock_check: int = 4096
    # intervals filed as arrays: (resource, group, activity, starts, ends, version, samples)
    chunks: list[tuple[str, str, str, np.ndarray, np.ndarray, int, np.ndarray]] = field(default_factory=list)
    # intervals of many resources filed as arrays: (names, groups, activity, index into names, starts,
    # ends, versions, samples)
    fleet_chunks: list[tuple[list[str], list[str], str, np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                             np.ndarray]] = field(default_factory=list)
    _busy: Counter[str] = field(default_factory=Counter)  # resource -> busy seconds summed so far
    _fleet_summed: int = 0  # fleet_chunks already in _busy
    _busy_parts: dict[str, list[float | np.ndarray]] = field(default_factory=dict)  # not summed yet

    @classmethod
    def bounded(cls, wall_seconds: float) -> Recorder:
        """A recorder whose run stops after `wall_seconds` (at most MAX_WALL_SECONDS)."""
        wall = min(wall_seconds, MAX_WALL_SECONDS)
        return cls(deadline=time.monotonic() + wall, wall_seconds=wall)

    def count(self, n: int = 1) -> None:
        """n more simulation events; stops a run that outgrows its budget."""
        self.events += n
        if self.events > MAX_EVENTS:
            raise SpecError("simulation exceeded its event budget; simulate fewer steps or a smaller batch")
        if self.events >= self._next_clock_check:  # the wall clock, every few thousand events
            self._next_clock_check = self.events + 4096
            if time.monotonic() > self.deadline:
                raise SpecError(f"simulation ran past {self.wall_seconds:g} s; "
                                "simulate fewer steps or a smaller batch")

    def interval(self, resource: str, group: str, activity: str, start: float, end: float, version: int,
                 samples: int) -> None:
        if end > start:
            self.timeline.append((resource, group, activity, start, end, version, samples))
            self._busy_parts.setdefault(resource, []).append(end - start)

    def intervals(self, resource: str, group: str, activity: str, starts: np.ndarray, ends: np.ndarray,
                  version: int, samples: np.ndarray) -> None:
        """Consecutive intervals of one resource, as `interval` would file them one by one."""
        durations = ends - starts
        keep = durations > 0  # end > start, as `interval` asks
        if not (keep[0] if len(keep) == 1 else keep.all()):  # one jump (a busy fleet's): no reduction
            starts, ends, samples, durations = starts[keep], ends[keep], samples[keep], durations[keep]
        self.chunks.append((resource, group, activity, starts, ends, version, samples))
        self._busy_parts.setdefault(resource, []).append(durations)

    def fleet_intervals(self, names: list[str], groups: list[str], activity: str, idx: np.ndarray,
                        starts: np.ndarray, ends: np.ndarray, versions: np.ndarray, samples: np.ndarray) -> None:
        """Intervals of resources names[idx[i]] (one engine each, or several of one engine in order)."""
        keep = ends > starts  # end > start, as `interval` asks
        if not keep.all():
            idx, starts, ends, versions, samples = idx[keep], starts[keep], ends[keep], versions[keep], samples[keep]
        if len(idx):
            self.fleet_chunks.append((names, groups, activity, idx, starts, ends, versions, samples))

    @property
    def busy(self) -> Counter[str]:
        """Busy seconds per resource: its intervals' lengths added in the order filed, one at a time."""
        if self._busy_parts:
            self._sum_parts()
        self._sum_fleet_chunks()
        return self._busy

    def _sum_parts(self) -> None:
        """Add `_busy_parts` to `_busy`, each resource's lengths one at a time in the order filed:
        one bincount over all of them (it adds each bin's weights in array order, starting from 0.0,
        so seeding a bin with the total so far gives the same bits as the loop it replaces)."""
        names = list(self._busy_parts)
        pieces: list[np.ndarray] = []
        owner: list[int] = []
        for resource in names:
            parts = [np.array([float(self._busy[resource])])]
            parts += [np.array([p]) if isinstance(p, float) else p for p in self._busy_parts[resource]]
            lengths = np.concatenate(parts)
            pieces.append(lengths)
            owner.append(len(lengths))
        totals = np.bincount(np.repeat(np.arange(len(names)), owner), weights=np.concatenate(pieces),
                             minlength=len(names))
        for resource, total in zip(names, totals.tolist(), strict=True):
            self._busy[resource] = total
        self._busy_parts = {}

    def _sum_fleet_chunks(self) -> None:
        """Add each fleet chunk's per-resource total to `_busy`, chunk after chunk: as arrays, one per
        list of names (element-wise additions in the same order as one resource at a time)."""
        chunks = self.fleet_chunks[self._fleet_summed:]
        self._fleet_summed = len(self.fleet_chunks)
        sums: dict[int, tuple[list[str], np.ndarray, np.ndarray, np.ndarray]] = {}
        for names, _, _, idx, starts, ends, _, _ in chunks:
            if id(names) not in sums:
                sums[id(names)] = (names, np.array([float(self._busy[n]) for n in names]), np.zeros(len(names), bool),
                                   np.full(len(names), np.nan))
            _, acc, touched, scratch = sums[id(names)]
            add_busy(acc, touched, idx, starts, ends, scratch)
        for names, acc, touched, _ in sums.values():
            for i in np.flatnonzero(touched).tolist():
                self._busy[names[i]] = float(acc[i])

    def rows(self) -> tuple[Row, ...]:
        """Every interval, in order of end time (ties: in the order filed)."""
        rows: list[Any] = list(self.timeline)
        if not self.chunks and not self.fleet_chunks:
            return tuple(rows)
        ends = [np.array([r[4] for r in self.timeline], dtype=np.float64)]
        for resource, group, activity, starts, stops, version, samples in self.chunks:
            rows.extend(zip(repeat(resource), repeat(group), repeat(activity), starts.tolist(), stops.tolist(),
                            repeat(version), samples.tolist(), strict=False))
            ends.append(stops)
        for names, groups, activity, idx, starts, stops, versions, samples in self.fleet_chunks:
            ids = idx.tolist()
            rows.extend(zip([names[i] for i in ids], [groups[i] for i in ids], repeat(activity), starts.tolist(),
                            stops.tolist(), versions.tolist(), samples.tolist(), strict=False))
            ends.append(stops)
        order = np.argsort(np.concatenate(ends), kind="stable")
        return tuple(rows[i] for i in order.tolist())
