"""What a simulation returns: summary metrics and the timeline."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd

from sim.recorder import Recorder
from traces.records import TIMELINE_COLUMNS


@dataclass(frozen=True)
class SimResult:
    samples_per_s: float
    tokens_per_s: float
    mean_step_s: float
    step_times: tuple[float, ...]
    utilization: dict[str, float]  # plan group -> busy fraction of its GPUs
    staleness_hist: dict[int, int]  # version lag -> trained tokens
    cost_per_hour: float
    trained_samples: int
    trained_ids: np.ndarray = field(compare=False)  # in training order (read-only)
    admitted: int
    in_flight: int
    events: int
    sim_seconds: float
    mode: str
    recorder: Recorder = field(repr=False, compare=False)  # the timeline, put together when asked for
    queue_rows: tuple[tuple[float, int, int, int], ...] = field(repr=False, default=())
    dropped: int = 0  # samples generated and dropped by dynamic sampling (filtered or surplus)
    settled: bool | None = None  # until_settled runs: whether the rate settled before the cap (None: fixed steps)

    @cached_property
    def timeline_rows(self) -> tuple[tuple[Any, ...], ...]:
        """(resource, group, activity, start, end, version, samples) per interval, by end time."""
        return self.recorder.rows()

    @property
    def max_staleness(self) -> int:
        return max((k for k, v in self.staleness_hist.items() if v > 0), default=0)

    @property
    def cost_per_1k_samples(self) -> float:
        if self.samples_per_s <= 0:
            return float("inf")
        return self.cost_per_hour / 3600 / self.samples_per_s * 1000

    @property
    def timeline(self) -> pd.DataFrame:
        """One row per interval: resource, group, activity, start, end, version, samples."""
        return pd.DataFrame(list(self.timeline_rows), columns=list(TIMELINE_COLUMNS))

    @property
    def queue(self) -> pd.DataFrame:
        """Over time: samples waiting for KV room, samples in flight, samples buffered for training."""
        return pd.DataFrame(list(self.queue_rows), columns=["time", "waiting", "in_flight", "buffered"])

    def to_frame(self) -> pd.DataFrame:
        """The headline figures as one row (for comparing runs by concatenation)."""
        row = {k: v for k, v in self.summary().items() if not isinstance(v, dict)}
        row.update({f"busy:{k}": v for k, v in self.utilization.items()})
        return pd.DataFrame([row])

    def _repr_html_(self) -> str:
        table = self.to_frame().T.rename(columns={0: "value"})
        return f"<b>simulated {self.mode} plan</b>" + table.to_html(float_format=lambda x: f"{x:,.4g}")

    def summary(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "samples_per_s": self.samples_per_s,
            "tokens_per_s": self.tokens_per_s,
            "mean_step_s": self.mean_step_s,
            "max_staleness": self.max_staleness,
            "staleness_hist": {str(k): v for k, v in sorted(self.staleness_hist.items())},
            "utilization": self.utilization,
            "cost_per_hour": self.cost_per_hour,
            "cost_per_1k_samples": self.cost_per_1k_samples,
            "trained_samples": self.trained_samples,
            "in_flight_at_end": self.in_flight,
            "events": self.events,
            "sim_seconds": self.sim_seconds,
        }
