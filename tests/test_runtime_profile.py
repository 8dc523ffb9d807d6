"""The profiler (`rlfleet profile`) and predicted vs measured (`rlfleet run`/`rlfleet fidelity`).

Fidelity, as the runtime issue asks: profile this machine, run a plan, simulate the run's plan with
those profiles, and report the error of the predicted throughput (asserted under 25%).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from traces import CostModel, ProfileTable, get_gpu, get_model
from traces.costmodel.tables import COLUMNS
from traces.records import read_run

TINY_GRID = ("--batches", "1,8", "--contexts", "4,8", "--train-tokens", "64,128", "--seq-len", "8",
             "--sync-engines", "1", "--repeats", "1")


def test_profile_rows_are_measured_and_the_cost_model_prefers_them(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "cpu.csv"
    res = cli("profile", "--model", "tiny-llama", "--gpu-type", "cpu-core", *TINY_GRID, "--out", str(out), "--json")
    assert res.code == 0, res.err
    assert res.json()["gpu_type"] == "CPU"  # the alias resolves to the catalog name
    frame = pd.read_csv(out)
    assert tuple(frame.columns) == COLUMNS
    assert set(frame["stage"]) == {"prefill", "decode", "train", "logprob", "sync"}
    assert frame["source"].str.startswith("measured").all() and (frame["seconds"] > 0).all()
    # 2 batches x 2 contexts: a prefill row and 3 decode rows each; 2 train sizes: logprob + train; 1 sync
    assert len(frame) == 4 * 4 + 2 * 2 + 1

    cm, roof = CostModel(ProfileTable.from_csv(out)), CostModel.roofline_only()
    cpu, tiny = get_gpu("CPU"), get_model("tiny-llama")
    inside = cm.decode(cpu, tiny, 1, 4, 6)
    assert inside.sources == {"profile"} and float(inside) != float(roof.decode(cpu, tiny, 1, 4, 6))
    measured = frame[(frame.stage == "decode") & (frame.batch == 8) & (frame.context == 6)]["seconds"].iloc[0]
    assert float(cm.decode(cpu, tiny, 1, 8, 6)) == pytest.approx(measured)  # a measured point is returned as is
    assert cm.decode(cpu, tiny, 1, 64, 6).sources == {"profile-scaled"}  # past the table: roofline scaled to it
    assert cm.train(cpu, tiny, 1, 1, 1, 96).sources == {"profile"}
    assert cm.sync(cpu, tiny, 1, 1e9).sources == {"profile"}
    assert cm.decode(get_gpu("H100"), tiny, 1, 4, 6).sources == {"roofline"}  # other types are not touched


@pytest.mark.parametrize(("args", "needle"), [
    (("--model", "no-such-model", "--gpu-type", "CPU"), "unknown model"),
    (("--model", "tiny-llama", "--gpu-type", "TPU9"), "unknown GPU type"),
    (("--model", "tiny-llama", "--gpu-type", "CPU", "--device", "cuda"), "--device cpu"),
    (("--model", "tiny-llama", "--gpu-type", "CPU", "--batches", "1,x"), "comma-separated"),
    (("--model", "tiny-llama", "--gpu-type", "CPU", "--train-tokens", "4", "--seq-len", "8"), "seq-len"),
    (("--model", "gpt3-175b", "--gpu-type", "CPU"), "GELU"),
])
def test_profile_bad_input_is_one_line(cli, args: tuple[str, ...], needle: str) -> None:  # type: ignore[no-untyped-def]
    res = cli("profile", *args)
    assert res.code == 2 and needle in res.err and len(res.err.strip().splitlines()) == 1


def test_fidelity_predicted_vs_measured_within_25_percent(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Profile this machine, run the plan on Ray, simulate the run with the profile: |error| < 25%.

    Profile and run must meet the same machine: a process left running by an earlier test, or a
    neighbour on a shared VM, can slow one and not the other (seen once in a full suite: every
    train step 30% slower than profiled minutes before, with no engine overlapping it). So a
    miss is measured again, once, from scratch; both attempts are printed, and the second must pass.
    """
    errors = []
    for attempt in range(2):
        prediction, profile, run_dir = _profile_run_predict(cli, tmp_path / f"attempt{attempt}")
        errors.append(prediction["error"])
        if abs(prediction["error"]) < 0.25:
            break
    assert set(prediction["cost_sources"].values()) == {"profile"}  # every stage priced from the measured table
    assert abs(prediction["error"]) < 0.25

    record = read_run(run_dir)  # what the run left is the simulator's input, and `fidelity` reproduces it
    assert record.plan.rollout[0].gpu_type == "CPU" and record.workload.model.name == "tiny-llama-256"
    again = cli("fidelity", str(run_dir), "--profile", str(profile), "--json")
    assert again.code == 0 and again.json() == prediction
    print(f"fidelity: predicted {prediction['predicted_samples_per_s']:.1f} samples/s, measured "
          f"{prediction['measured_samples_per_s']:.1f}, error {prediction['error']:+.1%} "
          f"(attempts: {', '.join(f'{e:+.1%}' for e in errors)})")


def _profile_run_predict(cli, folder: Path) -> tuple[dict, Path, Path]:  # type: ignore[no-untyped-def, type-arg]
    profile = folder / "cpu-tiny-llama-256.csv"
    folder.mkdir()
    # the grid brackets the run's shapes: 256-sample prefills of 5-token prompts, decode at batch <= 256,
    # train steps over ~1,800 tokens in two minibatches, sync to one engine
    res = cli("profile", "--model", "tiny-llama-256", "--gpu-type", "CPU", "--batches", "1,16,64,256",
              "--contexts", "4,8", "--train-tokens", "512,1024,2048", "--sync-engines", "1", "--out", str(profile))
    assert res.code == 0, res.err
    run_dir = folder / "run"
    # checkpoints only at the end: the simulator does not model checkpoint stalls; torch engines, as profiled
    res = cli("run", "traces/data/plans/toy-cpu-256.json", "--steps", "15", "--profile", str(profile),
              "--out", str(run_dir), "--checkpoint-every", "100", "--engine", "torch", "--json")
    assert res.code == 0, res.err
    return res.json()["prediction"], profile, run_dir


def test_fidelity_bad_run_folder_is_one_line(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    res = cli("fidelity", str(tmp_path / "missing"))
    assert res.code == 2 and "no such run folder" in res.err
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 0}) + "\n")
    res = cli("fidelity", str(tmp_path))
    assert res.code == 2 and "plan.json" in res.err and len(res.err.strip().splitlines()) == 1
