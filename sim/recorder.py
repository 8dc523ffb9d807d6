"""What the simulation saw: timeline intervals and time series, appended as plain tuples."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from traces import SpecError

TIMELINE_COLUMNS = ("resource", "group", "activity", "start", "end", "version", "samples")
MAX_EVENTS = 20_000_000  # a bound on any one simulation, so bad input cannot hang it
MAX_WALL_SECONDS = 600.0  # and a bound on its wall time, checked every few thousand events


@dataclass
class Recorder:
    timeline: list[tuple[str, str, str, float, float, int, int]] = field(default_factory=list)
    busy: Counter[str] = field(default_factory=Counter)  # resource -> busy seconds
    queue: list[tuple[float, int, int, int]] = field(default_factory=list)  # time, waiting, in flight, buffered
    staleness_tokens: Counter[int] = field(default_factory=Counter)
    step_ends: list[float] = field(default_factory=list)
    step_samples: list[int] = field(default_factory=list)
    step_tokens: list[int] = field(default_factory=list)
    trained_ids: list[int] = field(default_factory=list)
    events: int = 0
    deadline: float = field(default_factory=lambda: time.monotonic() + MAX_WALL_SECONDS)

    def count(self) -> None:
        """One more simulation event; stops a run that outgrows its budget."""
        self.events += 1
        if self.events > MAX_EVENTS:
            raise SpecError("simulation exceeded its event budget; simulate fewer steps or a smaller batch")
        if self.events % 4096 == 0 and time.monotonic() > self.deadline:
            raise SpecError(f"simulation ran past {MAX_WALL_SECONDS:.0f} s; simulate fewer steps or a smaller batch")

    def interval(self, resource: str, group: str, activity: str, start: float, end: float, version: int,
                 samples: int) -> None:
        if end > start:
            self.timeline.append((resource, group, activity, start, end, version, samples))
            self.busy[resource] += end - start
