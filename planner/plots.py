"""Plots of planner sweeps: throughput against a parameter, and cost/throughput frontiers."""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from sim.plots import gpu_colour, plt
from traces import gpu_names

LINE_COLOURS = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#ff9da6", "#9d755d"]


def throughput_curve(frame: pd.DataFrame, x: str, y: str = "samples_per_s", series: str | None = None,
                     xlabel: str | None = None, title: str | None = None) -> Figure:
    """`y` against `x`, one line per value of the `series` column (e.g. throughput vs staleness by mode)."""
    fig, ax = plt.subplots(figsize=(6, 3.6))
    groups = frame.groupby(series, sort=False) if series else [(None, frame)]
    for i, (name, part) in enumerate(groups):
        part = part.sort_values(x)
        ax.plot(part[x], part[y], marker="o", color=LINE_COLOURS[i % len(LINE_COLOURS)],
                label=None if name is None else str(name))
    ax.set_xlabel(xlabel or x)
    ax.set_ylabel("throughput (samples/s)" if y == "samples_per_s" else y)
    ax.set_ylim(bottom=0)
    if series:
        ax.legend(fontsize=8)
    ax.set_title(title or f"Throughput against {xlabel or x}")
    fig.tight_layout()
    return fig


def pareto_frontier(frontiers: dict[str, pd.DataFrame], title: str | None = None) -> Figure:
    """Cheapest $/h for each throughput, one step line per fleet (GPU-type colours for homogeneous ones)."""
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for i, (name, frame) in enumerate(frontiers.items()):
        if frame.empty:
            continue
        frame = frame.sort_values("samples_per_s")
        colour = gpu_colour(name) if name in gpu_names() else LINE_COLOURS[i % len(LINE_COLOURS)]
        ax.step(frame.samples_per_s, frame.cost_per_hour, where="post", marker="o", color=colour, label=name)
    ax.set_xlabel("throughput (samples/s)")
    ax.set_ylabel("cost ($/h)")
    ax.legend(fontsize=8)
    ax.set_title(title or "Cheapest plan for each throughput")
    fig.tight_layout()
    return fig


def baselines_bar(plan_rate: float, baselines: dict[str, float], title: str | None = None) -> Figure:
    """The plan's simulated throughput beside each baseline's."""
    names = ["this plan", *baselines]
    values = [plan_rate, *baselines.values()]
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.barh(range(len(names)), values, color=["#54a24b"] + ["#bab0ac"] * len(baselines))
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_xlabel("throughput (samples/s, simulated)")
    ax.set_ylabel("plan")
    ax.set_title(title or "The plan against its baselines (same budget)")
    fig.tight_layout()
    return fig
