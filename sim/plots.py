"""Plots of a simulation result (matplotlib, headless-safe)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from sim.result import SimResult

ACTIVITY_COLOURS = {
    "decode": "#4c78a8", "prefill": "#72b7b2", "reprefill": "#e45756", "weight_load": "#f58518",
    "logprob": "#b279a2", "train": "#54a24b", "sync": "#ff9da6",
}


def gantt(result: SimResult, max_resources: int = 24, title: str | None = None) -> Figure:
    """One row per resource (trainer first, then up to `max_resources - 1` engines), coloured by activity."""
    tl = result.timeline
    resources = ["trainer", *[r for r in dict.fromkeys(tl.resource) if r != "trainer"]][:max_resources]
    fig, ax = plt.subplots(figsize=(12, 0.35 * len(resources) + 1.5))
    for row, name in enumerate(resources):
        part = tl[tl.resource == name]
        for activity, chunk in part.groupby("activity"):
            ax.broken_barh(list(zip(chunk.start, chunk.end - chunk.start, strict=True)), (row - 0.4, 0.8),
                           color=ACTIVITY_COLOURS.get(str(activity), "grey"))
    ax.set_yticks(range(len(resources)), resources, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("resource")
    shown = sorted(set(tl[tl.resource.isin(resources)].activity))
    ax.legend(handles=[Patch(color=ACTIVITY_COLOURS.get(a, "grey"), label=a) for a in shown],
              loc="upper right", fontsize=7, ncols=len(shown))
    ax.set_title(title or f"{result.mode} plan: {result.samples_per_s:.1f} samples/s, "
                 f"mean step {result.mean_step_s:.1f} s, max staleness {result.max_staleness}")
    fig.tight_layout()
    return fig
