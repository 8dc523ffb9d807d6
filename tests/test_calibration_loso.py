"""Issue 20's acceptance on the calibration set, as bench/fidelity.py --quick measures it: the
leave-one-source-out error (refit without each source, predict it) over the point rows (bounds apart)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from sim.calibration_set import case
from traces.calibration import load_calibration
from traces.costmodel.fit import Case, Judged, leave_one_source_out, summary


def _bench() -> ModuleType:
    """bench/fidelity.py (not a package): its start, prior and fitted fields, so the test judges what it prints."""
    path = Path(__file__).resolve().parents[1] / "bench" / "fidelity.py"
    spec = importlib.util.spec_from_file_location("bench_fidelity", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def judged() -> list[Judged]:
    b = _bench()
    cases = [c for c in map(case, load_calibration()) if isinstance(c, Case) and c.kind != "rl_step"]
    _, out = leave_one_source_out(cases, list(b.FIELDS), start=b.NEUTRAL, prior_weight=b.PRIOR_WEIGHT)
    return out


def _held_out(judged: list[Judged]) -> dict[str, float]:
    """Over the fitted point rows; rows judged only (sim.calibration_set.JUDGED_ONLY) are held to the
    goal apart, as the RL-step rows are (tests/test_calibration_phases.py)."""
    return summary([j.held_out_error for j in judged if not j.case.bound and j.case.fitted])


def test_held_out_median_within_10_percent_and_no_one_sided_bias(judged: list[Judged]) -> None:
    s = _held_out(judged)
    assert s["n"] >= 40
    assert s["median_abs"] <= 0.10, s
    assert abs(s["signed_median"]) <= 0.05, s


def test_upper_bounds_hold_held_out(judged: list[Judged]) -> None:
    bounds = [j for j in judged if j.case.bound]
    assert bounds and all(j.held_out_error == 0.0 for j in bounds), [(j.case.id, j.held_out_error) for j in bounds]


def test_held_out_worst_within_30_percent(judged: list[Judged]) -> None:
    """Held since the last pipeline stage carries the LM head (traces.costmodel.pipeline) and GB200 has its
    measured matmul ceiling (traces/data/gpus.yaml): 38.6% -> 22.2% (bench/fidelity.py --quick, 2026-12-03)."""
    assert _held_out(judged)["worst_abs"] <= 0.30


@pytest.mark.xfail(strict=True, reason="C82-C85, TRL's LoRA trainer on 2 H200 at 3.9-23.5% MFU: framework-bound, "
                                       "-28% to -88% held out, C83 alone within 30% (traces/data/calibration/"
                                       "README.md, tenth and eleventh sessions)")
def test_judged_only_rows_within_30_percent(judged: list[Judged]) -> None:
    rows = [j for j in judged if not j.case.fitted]
    assert rows and all(abs(j.held_out_error) <= 0.30 for j in rows), [(j.case.id, j.held_out_error) for j in rows]
