"""Plots of a simulation result (matplotlib, headless-safe)."""

from __future__ import annotations

import matplotlib
import matplotlib.pyplot as plt  # headless machines fall back to Agg; notebooks keep their inline backend
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from sim.result import SimResult
from traces import gpu_names

ACTIVITY_COLOURS = {
    "decode": "#4c78a8", "prefill": "#72b7b2", "reprefill": "#e45756", "weight_load": "#f58518",
    "logprob": "#b279a2", "train": "#54a24b", "sync": "#ff9da6",
}


def gantt(result: SimResult | pd.DataFrame, max_resources: int = 24, title: str | None = None,
          ax: Axes | None = None, xlabel: str = "simulated time (s)") -> Figure:
    """One row per resource (trainers first, then up to `max_resources - 1` engines), coloured by activity.

    `result` is a simulation or a timeline frame in its columns (a measured run's timeline.csv);
    `ax` draws into an existing axes, e.g. to put a run and its simulation side by side.
    """
    tl = result if isinstance(result, pd.DataFrame) else result.timeline
    names = list(dict.fromkeys(tl.resource))
    resources = sorted(names, key=lambda r: not str(r).startswith("trainer"))[:max_resources]
    if ax is None:
        fig, ax = plt.subplots(figsize=(12, 0.35 * len(resources) + 1.5))
    else:
        fig = ax.figure
    for row, name in enumerate(resources):
        part = tl[tl.resource == name]
        for activity, chunk in part.groupby("activity"):
            ax.broken_barh(list(zip(chunk.start, chunk.end - chunk.start, strict=True)), (row - 0.4, 0.8),
                           color=ACTIVITY_COLOURS.get(str(activity), "grey"))
    ax.set_yticks(range(len(resources)), resources, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_ylabel("resource")
    shown = sorted(set(tl[tl.resource.isin(resources)].activity))
    ax.legend(handles=[Patch(color=ACTIVITY_COLOURS.get(a, "grey"), label=a) for a in shown],
              loc="upper right", fontsize=7, ncols=len(shown))
    if title is None and isinstance(result, SimResult):
        title = (f"{result.mode} plan: {result.samples_per_s:.1f} samples/s, "
                 f"mean step {result.mean_step_s:.1f} s, max staleness {result.max_staleness}")
    ax.set_title(title or "timeline")
    fig.tight_layout()
    return fig


def gpu_colour(name: str) -> str:
    """One colour per GPU type, the same in every plot (catalog order over a 12-colour palette)."""
    palette = plt.get_cmap("tab20").colors
    names = gpu_names()
    index = names.index(name) if name in names else len(names)
    return matplotlib.colors.to_hex(palette[(2 * index) % 20 if index < 10 else (2 * index + 1) % 20])


def _group_gpu(group: str) -> str | None:
    """'rollout:H20:tp1' -> 'H20'; the trainer row has no type in the result."""
    parts = group.split(":")
    return parts[1] if len(parts) == 3 else None


def utilization(result: SimResult, title: str | None = None) -> Figure:
    """Busy share of each plan group's GPUs over the run, bars coloured by GPU type."""
    groups = list(result.utilization)
    values = [100 * result.utilization[g] for g in groups]
    colours = [gpu_colour(t) if (t := _group_gpu(g)) else "#7f7f7f" for g in groups]
    fig, ax = plt.subplots(figsize=(max(4.0, 1.2 * len(groups) + 1), 3.2))
    ax.bar(range(len(groups)), values, color=colours)
    ax.set_xticks(range(len(groups)), groups, rotation=20, ha="right", fontsize=8)
    ax.set_ylim(0, 100)
    ax.set_xlabel("plan group")
    ax.set_ylabel("busy (% of time)")
    ax.set_title(title or "How busy each group of GPUs was")
    fig.tight_layout()
    return fig


def staleness_histogram(result: SimResult, title: str | None = None) -> Figure:
    """Share of trained tokens by how many policy versions old they were."""
    lags = sorted(result.staleness_hist)
    total = sum(result.staleness_hist.values()) or 1
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.bar(lags, [100 * result.staleness_hist[k] / total for k in lags], color="#4c78a8")
    ax.set_xticks(lags)
    ax.set_xlabel("staleness (policy versions behind the trainer)")
    ax.set_ylabel("trained tokens (%)")
    ax.set_title(title or f"Token staleness (max {result.max_staleness})")
    fig.tight_layout()
    return fig
