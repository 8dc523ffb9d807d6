"""`rlfleet calibrate`: a run's logged phases in, a cost table out that reproduces the run's step time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim import simulate
from sim.breakdown import mean_phases
from traces import CostModel, ProfileTable
from traces.phases import read_phase_log
from traces.records import read_run

RUN = "traces/data/runs/toy-cpu-256"


def test_calibrating_on_a_recorded_run_recovers_its_step_time(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The shipped CPU run (rlfleet run --out): the roofline alone misses its step by ~15%; the
    calibrated profile, fed back to the simulator, is within 10% (and each phase too)."""
    out = tmp_path / "cal.csv"
    res = cli("calibrate", RUN, "--out", str(out), "--json")
    assert res.code == 0, res.err
    obj = res.json()
    assert abs(obj["predicted_before"]["step"] / obj["measured"]["step"] - 1) > 0.10
    record = read_run(RUN)
    measured = mean_phases(record.timeline, record.plan.staleness)
    cm = CostModel(ProfileTable.shipped().overlay(ProfileTable.from_csv(out)))
    r = simulate(record.cluster, record.workload, record.plan, cm, steps=record.steps, seed=0)
    assert r.mean_step_s == pytest.approx(measured["step"], rel=0.10)
    predicted = mean_phases(r.timeline, record.plan.staleness)
    for phase in ("logprob", "train"):
        assert predicted[phase] == pytest.approx(measured[phase], rel=0.10), phase


VERL = Path("traces/data/runs/verl-qwen3-4b-4x4090")  # a published verl step (its README cites it)


def test_calibrating_on_a_published_verl_log_recovers_its_step_time(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """verl issue 7412's logged step (Qwen3-4B GRPO on four RTX 4090s, colocated): the roofline alone
    predicts it 3.6x too fast; the calibrated profile, fed back to the simulator, is within 10% of the
    logged step and of its generation phase (timing_s/gen)."""
    out = tmp_path / "cal.csv"
    res = cli("calibrate", str(VERL / "metrics.jsonl"), "--cluster", str(VERL / "cluster.yaml"),
              "--workload", str(VERL / "workload.yaml"), "--plan", str(VERL / "plan.json"), "--out", str(out), "--json")
    assert res.code == 0, res.err
    obj = res.json()
    assert obj["predicted_before"]["step"] < 0.5 * obj["measured"]["step"]
    from traces import load_cluster, load_plan, load_workload
    cluster, workload, plan = (load_cluster(VERL / "cluster.yaml"), load_workload(VERL / "workload.yaml"),
                               load_plan(VERL / "plan.json"))
    cm = CostModel(ProfileTable.shipped().overlay(ProfileTable.from_csv(out)))
    r = simulate(cluster, workload, plan, cm, steps=6, seed=0)
    predicted = mean_phases(r.timeline, plan.staleness)
    assert predicted["step"] == pytest.approx(obj["measured"]["step"], rel=0.10)
    assert predicted["wait"] == pytest.approx(obj["measured"]["wait"], rel=0.10)


def test_verl_metrics_are_read_by_their_timing_keys(tmp_path: Path) -> None:
    log = tmp_path / "metrics.jsonl"
    log.write_text("\n".join(json.dumps(row) for row in [
        {"step": 1, "timing_s/gen": 30.0, "timing_s/old_log_prob": 4.0, "timing_s/ref": 3.0,
         "timing_s/update_actor": 20.0, "timing_s/step": 60.0, "actor/loss": 0.1},
        {"step": 2, "data": {"timing_s/gen": 28.0, "timing_s/step": 55.0}},  # verl's logger nests them
        {"step": 3, "actor/loss": 0.1},  # a row without timings is skipped
    ]))
    rows = read_phase_log(log)
    assert rows == [{"wait": 30.0, "logprob": 7.0, "train": 20.0, "step": 60.0}, {"wait": 28.0, "step": 55.0}]
    csv = tmp_path / "metrics.csv"
    csv.write_text("step,timing_s/gen,timing_s/step\n1,30,60\n2,,55\n")
    assert read_phase_log(csv) == [{"wait": 30.0, "step": 60.0}, {"step": 55.0}]


@pytest.mark.parametrize(("text", "args", "message"), [
    ('{"timing_s/step": 10}\n', (), "metrics files need the run's --cluster, --workload, --plan"),
    ('{"actor/loss": 1}\n', ("--cluster", f"{RUN}/cluster.yaml", "--workload", f"{RUN}/workload.yaml",
                             "--plan", f"{RUN}/plan.json"), "no step with a timing_s/step value"),
    ('{"timing_s/step": "slow"}\n', ("--cluster", f"{RUN}/cluster.yaml", "--workload", f"{RUN}/workload.yaml",
                                     "--plan", f"{RUN}/plan.json"), "timing_s/step is not a number"),
    ('{"timing_s/step": -1}\n', ("--cluster", f"{RUN}/cluster.yaml", "--workload", f"{RUN}/workload.yaml",
                                 "--plan", f"{RUN}/plan.json"), "must be a finite number of seconds"),
    ("not json\n", ("--cluster", f"{RUN}/cluster.yaml", "--workload", f"{RUN}/workload.yaml",
                    "--plan", f"{RUN}/plan.json"), "not JSON lines"),
])
def test_bad_logs_are_one_line(cli, tmp_path: Path, text: str, args: tuple[str, ...], message: str) -> None:  # type: ignore[no-untyped-def]
    log = tmp_path / "m.jsonl"
    log.write_text(text)
    res = cli("calibrate", str(log), *args, "--out", str(tmp_path / "p.csv"))
    assert res.code == 2 and message in res.err and len(res.err.strip().splitlines()) == 1, res.err
