"""Settling runs (traces.records.settled, simulate(until_settled=True), `rlfleet simulate --until-settled`).

A short window can miss slow steps that recur at a longer period than eta + 1 (README, "the
simulated figure's window"); a settling run goes on until its steady rate stops moving.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.cli import main
from sim import simulate
from traces import (
    Cluster,
    CostModel,
    Plan,
    RolloutGroup,
    TrainerGroup,
    Workload,
    example_cluster,
    example_workload,
    load_cluster,
    load_plan,
    load_workload,
)
from traces.records import SETTLE_MIN_PERIODS, recommended_steps, settle_cap, settled

DATA = Path(__file__).parent / "data" / "window"
ROOT = Path(__file__).resolve().parents[1]


def _demo() -> tuple[Cluster, Workload, Plan]:  # the demo's fleet and job, a plan of the kind `make demo` picks
    plan = Plan(mode="async", staleness=4,
                rollout=(RolloutGroup(gpu_type="H800", tp=1, instances=32),
                         RolloutGroup(gpu_type="H20", tp=4, instances=32)),
                trainer=TrainerGroup(gpu_type="H800", dp=32))
    return example_cluster("mixed-h800-h20-l40s"), example_workload("qwen2.5-7b-grpo-longtail"), plan


def _ends(step_seconds: list[float]) -> list[float]:
    out, t = [], 0.0
    for s in step_seconds:
        t += s
        out.append(t)
    return out


def test_a_steady_run_settles_at_the_first_period_boundary_past_the_minimum() -> None:
    period = 5  # staleness 4
    steps = [10.0] * 60
    first = next(n for n in range(1, 61) if settled(_ends(steps[:n]), [100] * n, 4))
    assert first == period + SETTLE_MIN_PERIODS * period
    assert not settled(_ends(steps[:first + 1]), [100] * (first + 1), 4)  # not at a period boundary


def test_slow_steps_after_the_minimum_keep_the_run_going() -> None:
    # fast periods, then a slow one where the minimum would have stopped a steady run
    steps = [10.0] * 15 + [40.0] * 5 + [10.0] * 40
    ends, samples = _ends(steps), [100] * len(steps)
    assert not settled(ends[:20], samples[:20], 4)
    assert not settled(ends[:25], samples[:25], 4)  # the rate still moves more than the tolerance
    assert any(settled(ends[:n], samples[:n], 4) for n in range(26, 61))


def test_the_cap_holds_the_warm_up_and_whole_periods() -> None:
    for eta in (0, 1, 2, 4, 8):
        period = eta + 1
        cap = settle_cap(eta)
        assert cap % period == 0 and cap - period >= 48 and cap > recommended_steps(eta)


def test_a_settling_run_is_the_cap_run_cut_short() -> None:
    cluster, workload, p = _demo()
    cap = settle_cap(p.staleness)
    short = simulate(cluster, workload, p, CostModel(), steps=cap, seed=0, until_settled=True)
    full = simulate(cluster, workload, p, CostModel(), steps=cap, seed=0)
    n = len(short.step_times)
    assert short.settled is True and n < cap and (n - (p.staleness + 1)) % (p.staleness + 1) == 0
    assert short.step_times == full.step_times[:n]
    assert full.settled is None


def test_a_cap_below_the_minimum_says_it_did_not_settle() -> None:
    cluster, workload, p = _demo()
    r = simulate(cluster, workload, p, CostModel(), steps=2 * (p.staleness + 1), seed=0, until_settled=True)
    assert r.settled is False and len(r.step_times) == 2 * (p.staleness + 1)


@pytest.mark.slow
def test_the_short_window_overstates_a_plan_whose_slow_steps_recur_later() -> None:
    """The README's case: 1 H800 + 3 L40S nodes, qwen3-30b-a3b, staleness 8."""
    cluster = load_cluster(DATA / "h800-l40s.yaml")
    workload = load_workload(ROOT / "traces" / "data" / "workloads" / "qwen3-30b-a3b-grpo.yaml")
    p = load_plan(DATA / "qwen3-30b-a3b-plan.json")
    short = simulate(cluster, workload, p, CostModel(), steps=recommended_steps(8), seed=0)
    long = simulate(cluster, workload, p, CostModel(), steps=90, seed=0)
    settling = simulate(cluster, workload, p, CostModel(), steps=settle_cap(8), seed=0, until_settled=True)
    assert short.samples_per_s > 1.3 * long.samples_per_s  # the default window misses the slow waves
    assert abs(settling.samples_per_s / long.samples_per_s - 1) < 0.08


def test_cli_until_settled_prints_and_reports_the_steps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = _demo()[2]
    (tmp_path / "p.json").write_text(p.model_dump_json())
    files = ["--cluster", str(ROOT / "traces/data/clusters/mixed-h800-h20-l40s.yaml"),
             "--workload", str(ROOT / "traces/data/workloads/qwen2.5-7b-grpo-longtail.yaml"),
             "--plan", str(tmp_path / "p.json")]
    assert main(["simulate", *files, "--until-settled", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["settled"] is True and out["steps"] < settle_cap(p.staleness)
    assert main(["simulate", *files, "--until-settled", "--steps", "3"]) == 0
    assert "settled     no" in capsys.readouterr().out
