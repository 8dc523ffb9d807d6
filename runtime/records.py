"""What a run writes: `metrics.jsonl` (one line per step) and `timeline.csv` in the simulator's format.

The formats are traces.records' (shared with the simulator): the timeline has the simulator's
columns, times in seconds from the run's start, so a measured run and its simulation compare with
one function call (sim.fidelity). Files are rewritten atomically at each flush: a reader
(or a crash) sees the previous complete file or the new one, never half of one.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from traces.io import atomic_write_text
from traces.records import METRICS_FILE, TIMELINE_COLUMNS, TIMELINE_FILE, read_metrics

__all__ = ["TIMELINE_COLUMNS", "RunRecorder", "read_metrics"]



@dataclass
class RunRecorder:
    out_dir: Path | None
    origin: float  # clock reading at the run's start
    timeline: list[tuple[str, str, str, float, float, int, int]] = field(default_factory=list)
    metrics: list[dict[str, Any]] = field(default_factory=list)

    def interval(self, resource: str, group: str, activity: str, start: float, end: float, version: int,
                 samples: int) -> None:
        if end > start:
            self.timeline.append((resource, group, activity, start - self.origin, end - self.origin, version,
                                  samples))

    def metric(self, row: dict[str, Any]) -> None:
        self.metrics.append(row)

    def flush(self) -> None:
        if self.out_dir is None:
            return
        atomic_write_text(self.out_dir / METRICS_FILE, "".join(json.dumps(m) + "\n" for m in self.metrics))
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(TIMELINE_COLUMNS)
        for res, group, act, start, end, version, samples in self.timeline:
            writer.writerow([res, group, act, f"{start:.6f}", f"{end:.6f}", version, samples])
        atomic_write_text(self.out_dir / TIMELINE_FILE, buf.getvalue())
