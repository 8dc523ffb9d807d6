"""Plot functions (axes and series), notebook-friendly reprs, and the HTML report in headless Chromium."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import matplotlib
import pandas as pd
import pytest

from planner.plots import baselines_bar, pareto_frontier, throughput_curve
from sim import simulate
from sim.plots import gantt, gpu_colour, staleness_histogram, utilization
from traces import CostModel, example_cluster, example_workload, load_plan

CM = CostModel.roofline_only()
CLUSTER = example_cluster("mixed-h800-h20-l40s")
WORKLOAD = example_workload("qwen2.5-1.5b-math-short")
PLAN = load_plan("traces/data/plans/mixed-math-short.json")


@pytest.fixture(scope="module")
def result():  # type: ignore[no-untyped-def]
    return simulate(CLUSTER, WORKLOAD, PLAN, CM, steps=4, seed=0)


def test_gantt_has_a_row_per_resource_and_labelled_axes(result) -> None:  # type: ignore[no-untyped-def]
    ax = gantt(result, max_resources=10).axes[0]
    assert ax.get_xlabel() == "simulated time (s)" and ax.get_ylabel() == "resource"
    assert len(ax.get_yticks()) == 10 and ax.get_yticklabels()[0].get_text() == "trainer"
    assert "samples/s" in ax.get_title()


def test_utilization_has_a_bar_per_group_coloured_by_gpu(result) -> None:  # type: ignore[no-untyped-def]
    ax = utilization(result).axes[0]
    assert ax.get_ylabel() == "busy (% of time)" and ax.get_xlabel() == "plan group"
    bars = ax.patches
    assert len(bars) == len(result.utilization) == 3  # H20 engines, L40S engines, trainer
    assert pd.Series([b.get_facecolor() for b in bars]).nunique() == 3
    assert gpu_colour("H20") != gpu_colour("L40S")
    # each engine group's bar has its GPU type's colour (the trainer's row names no type)
    colours = {label.get_text(): matplotlib.colors.to_hex(b.get_facecolor())
               for label, b in zip(ax.get_xticklabels(), bars, strict=True)}
    engine_rows = {k: v for k, v in colours.items() if k.startswith("rollout:")}
    assert len(engine_rows) == 2
    assert all(v == gpu_colour(k.split(":")[1]) for k, v in engine_rows.items()), colours


def test_staleness_histogram_has_a_bar_per_lag(result) -> None:  # type: ignore[no-untyped-def]
    ax = staleness_histogram(result).axes[0]
    assert "staleness" in ax.get_xlabel() and ax.get_ylabel() == "trained tokens (%)"
    assert len(ax.patches) == len(result.staleness_hist)
    assert sum(b.get_height() for b in ax.patches) == pytest.approx(100)


def test_throughput_curve_has_one_line_per_series() -> None:
    frame = pd.DataFrame({"eta": [0, 1, 2] * 2, "samples_per_s": [1, 2, 3, 1, 1.5, 2], "mode": ["a"] * 3 + ["b"] * 3})
    ax = throughput_curve(frame, "eta", series="mode", xlabel="staleness bound").axes[0]
    assert len(ax.get_lines()) == 2 and ax.get_xlabel() == "staleness bound"
    assert ax.get_ylabel() == "throughput (samples/s)"


def test_pareto_frontier_has_one_line_per_fleet() -> None:
    frames = {"H800": pd.DataFrame({"samples_per_s": [1, 2], "cost_per_hour": [10, 20]}),
              "mixed": pd.DataFrame({"samples_per_s": [1, 3], "cost_per_hour": [8, 25]})}
    ax = pareto_frontier(frames).axes[0]
    assert len(ax.get_lines()) == 2
    assert ax.get_xlabel() == "throughput (samples/s)" and ax.get_ylabel() == "cost ($/h)"
    assert ax.get_lines()[0].get_color() == gpu_colour("H800")


def test_baselines_bar_has_the_plan_and_each_baseline() -> None:
    ax = baselines_bar(5.0, {"homogeneous": 4.0, "split-75/25": 3.0}).axes[0]
    assert len(ax.patches) == 3 and "samples/s" in ax.get_xlabel()


def test_plan_and_result_show_well_in_a_notebook(result) -> None:  # type: ignore[no-untyped-def]
    frame = PLAN.to_frame()
    assert list(frame.role) == ["rollout", "rollout", "train"] and frame.gpus.sum() == PLAN.total_gpus
    assert "<table" in PLAN._repr_html_() and "H20" in PLAN._repr_html_()
    assert result.to_frame().loc[0, "samples_per_s"] == result.samples_per_s
    assert "<table" in result._repr_html_()
    assert PLAN.summary()["total_gpus"] == 96 + 32 + 64


def test_report_renders_in_headless_chromium(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The page opens from disk with no server; every image decodes and the plan table is there."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    assert browser, "Chromium is missing: `make test` installs the Debian package chromium"
    res = cli("report", "traces/data/plans/mixed-math-short.json",
              "--cluster", "traces/data/clusters/mixed-h800-h20-l40s.yaml",
              "--workload", "traces/data/workloads/qwen2.5-1.5b-math-short.yaml",
              "--out", str(tmp_path), "--steps", "3")
    assert res.code == 0, res.err
    page = tmp_path / "report.html"
    dom = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000",
                          "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120).stdout
    assert 'data-images-ok="true"' in dom, dom[:500]
    images = int(dom.split('data-images="')[1].split('"')[0])
    assert images >= 4  # Gantt, utilization, staleness, Pareto
    # the shipped plan mixes H20 and L40S engines: the exports section names the re-plan AReaL and verl need
    assert 'class="dataframe plan-table"' in dom and "rlfleet plan --framework areal" in dom
