"""Runtime faults: rollout engines and the trainer killed mid-run (real Ray actors on loopback, real
torch training on CPU), and the state a resume restores.

- the trainer's checkpoint restores weights, Adam's moments and step counters, the config (the LR
  schedule) and the RNG: the step after a reload is bitwise the step the original trainer takes;
- the controller's snapshot restores the prompt stream and re-routes the samples that were in flight;
- an engine killed mid-generation is replaced: its samples are generated again, none is lost or
  trained twice (sample ids checked over the whole run), the staleness bound holds;
- an engine killed as the weights go out (the broadcast breaks, the survivor waits out the sync
  timeout): the group is rebuilt and the run carries on, with the same guarantees;
- a trainer killed mid-step: the run stops naming its checkpoint, `resume` continues it to the same
  step count, policy version and Adam step count as an uninterrupted run, redoing only that step;
- `rlfleet run --resume DIR`: continues a run, and refuses a folder without a checkpoint or with
  another run's in one line (exit 2).
"""

from __future__ import annotations

import csv
import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from runtime.records import read_metrics

ETA = 2
SMALL = {"staleness": ETA, "prompts_per_step": 4, "group_size": 8}  # 32 samples a step: seconds per run


# -- what a resume restores, without Ray ---------------------------------------------------------------
def test_trainer_checkpoint_restores_optimizer_schedule_and_rng(tmp_path: Path) -> None:
    from runtime.model import CharTokenizer, build_model, tiny_llama_config
    from runtime.trainer import Rollout, TrainConfig, Trainer

    tok = CharTokenizer()
    model = build_model(tiny_llama_config(tok), seed=0)
    config = TrainConfig(lr=2e-3, decay_steps=6, lr_final_ratio=0.25, entropy_coef=0.01)
    prompt = tuple(tok.encode("2+3="))
    batch = [Rollout(prompt, (5 + i % 3, tok.eos_id), (-2.0, -1.0), (0, 0), float(i % 2), i // 4) for i in range(8)]
    original = Trainer(model, tok.pad_id, config, seed=3)
    for _ in range(3):
        original.train_step(batch)
    path = tmp_path / "trainer.pt"
    original.save_checkpoint(path)
    saved = torch.load(path, weights_only=True)

    resumed = Trainer(build_model(tiny_llama_config(tok), seed=1), tok.pad_id, TrainConfig(), seed=0)
    torch.manual_seed(99)  # a different RNG stream: the checkpoint must bring back the saved one
    resumed.load_checkpoint(path)
    assert resumed.version == 3 and resumed.seed == 3 and resumed.config == config
    assert resumed.lr_at(4) == original.lr_at(4) < config.lr  # the schedule continues where it was
    assert resumed.optimizer_steps() == original.optimizer_steps() == 3 * config.minibatches
    state = resumed.optimizer.state_dict()["state"]
    assert set(state) == set(saved["optimizer"]["state"]) and state
    for index, moments in saved["optimizer"]["state"].items():
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(state[index][key], moments[key]), (index, key)
    assert torch.equal(torch.get_rng_state(), saved["torch_rng"])

    a = original.train_step(batch)
    b = resumed.train_step(batch)
    assert a == b  # the same step: loss, norms, entropy bit for bit
    for (name, x), y in zip(original.model.state_dict().items(), resumed.model.state_dict().values(), strict=True):
        assert torch.equal(x, y), name


def test_controller_snapshot_continues_the_prompt_stream_and_reroutes_what_was_in_flight() -> None:
    from runtime.controller import Controller, LoopConfig
    from runtime.engine import TorchEngine
    from runtime.model import CharTokenizer, build_model, tiny_llama_config
    from runtime.records import RunRecorder
    from runtime.task import AdditionTask

    tok, task = CharTokenizer(), AdditionTask(max_operand=4)
    model = build_model(tiny_llama_config(tok), seed=0)
    config = LoopConfig(steps=4, prompts_per_step=2, group_size=4, staleness=1)

    def engine(name: str, version: int = 0) -> TorchEngine:
        return TorchEngine(model, tok.eos_id, tok.pad_id, name=name, max_batch=64, seed=1, version=version)

    def drain(engine: TorchEngine) -> list[tuple[int, tuple[int, ...]]]:
        out = []
        while not engine.idle():
            out += [(c.sid, c.prompt) for c in engine.step()]
        return sorted(out)

    first = Controller(task, tok, config, seed=5)
    e1 = engine("e1")
    first.route([e1])  # (eta + 1) * 2 = 4 groups of 4 samples
    for c in e1.step():  # one token each: the prefill iteration; some answers may already end
        first.complete(c)
    state = json.loads(json.dumps(first.snapshot()))  # as it travels: through a JSON file
    done = {c["sid"] for g in state["groups"] for c in g["done"]}
    assert state["admitted"] == 4 and len(state["groups"]) + len(state["buffer"]) == 4

    second = Controller(task, tok, config, seed=0)  # another seed: the snapshot's stream must win
    second.restore(state, RunRecorder(None, 0.0))
    e2 = engine("e2")
    second.route([e2])  # no allowance left at version 0: only what was in flight goes out again
    buffered = {s for b in state["buffer"] for s in b["sids"]}
    assert [sid for sid, _ in drain(e2)] == sorted(set(range(16)) - done - buffered)
    # the next groups admitted are the ones the first controller would have admitted, prompts included
    first.ctl.new_version(1)
    second.ctl.new_version(1)
    e3, e4 = engine("e3", 1), engine("e4", 1)
    first.route([e3])
    second.route([e4])
    new = drain(e3)
    assert new and new == drain(e4) and min(sid for sid, _ in new) == 16


def _listeners(port: int) -> set[str]:
    """Local addresses listening on `port` (Linux /proc/net/tcp{,6}: hex address:port, state 0A)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        path = Path(table)
        lines = path.read_text().splitlines()[1:] if path.exists() else []
        for fields in (line.split() for line in lines):
            address, hex_port = fields[1].split(":")
            if fields[3] == "0A" and int(hex_port, 16) == port:
                found.add(address)
    return found


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads Linux's socket table")
def test_the_weight_sync_store_listens_on_the_given_address_only() -> None:
    """torch's TCPStore alone would listen on every interface; the trainer's store stays on its node's
    Ray address, loopback in tests and local runs."""
    from runtime.sync import SyncGroup

    store = SyncGroup.host_store("127.0.0.1", 1, 5.0)
    assert _listeners(int(store.port)) == {"0100007F"}  # 127.0.0.1, not 00000000 (0.0.0.0) nor ::


# -- on Ray -----------------------------------------------------------------------------------------
def _ledger(out: Path) -> tuple[list[int], set[int], set[int], int]:
    """Over the whole run, from its files: groups trained (each step's metrics row), and from the last
    commit record the completed groups not yet trained, the groups in flight and how many were admitted."""
    state = json.loads((out / "checkpoint.json").read_text())["controller"]
    trained = [uid for row in read_metrics(out) for uid in row["groups"]]
    return trained, {b["uid"] for b in state["buffer"]}, {g["uid"] for g in state["groups"]}, state["admitted"]


def _assert_nothing_lost_or_trained_twice(result: Any, out: Path, group_size: int) -> dict[str, int]:
    trained, buffered, in_flight, admitted = _ledger(out)
    assert len(trained) == len(set(trained))  # no group trained twice
    assert not (set(trained) & buffered) and not (set(trained) & in_flight) and not (buffered & in_flight)
    assert set(trained) | buffered | in_flight == set(range(admitted))  # every admitted group accounted for
    counts = Counter(result.trained_sids)  # this process's samples, by id
    assert max(counts.values()) == 1 and result.duplicates == 0
    mine = trained[-len(result.trained_sids) // group_size:]
    assert sorted(counts) == sorted(uid * group_size + j for uid in mine for j in range(group_size))
    regenerated = set(result.requeued_sids)
    assert regenerated <= set(counts)  # what the dead engine held was generated again and trained
    assert result.max_staleness <= ETA and all(r["max_staleness"] <= ETA for r in read_metrics(out))
    return {"admitted": admitted, "trained": len(trained), "lost": admitted - len(trained) - len(buffered)
            - len(in_flight), "regenerated": len(regenerated), "max_staleness": result.max_staleness}


def _timeline(out: Path) -> list[dict[str, str]]:
    with (out / "timeline.csv").open() as handle:
        return list(csv.DictReader(handle))


def test_killed_engine_is_replaced_and_its_samples_regenerated(ray_cluster: None, tmp_path: Path) -> None:
    """One engine, killed mid-generation after version 2: the run cannot go on without its replacement."""
    from runtime.settings import Faults
    from runtime.toy import run_toy_ray

    result = run_toy_ray(6, engines=1, seed=0, out_dir=tmp_path, faults=Faults(kill_engine=(0, 2)), **SMALL)
    figures = _assert_nothing_lost_or_trained_twice(result, tmp_path, SMALL["group_size"])
    print(f"\nengine killed mid-generation: {figures}, restarts {result.engine_restarts}, {result.seconds:.1f} s")
    assert result.steps == result.version == 6 and result.engine_restarts == 1
    assert figures["regenerated"] > 0 and figures["lost"] == 0
    rows = _timeline(tmp_path)
    restart = [r for r in rows if r["activity"] == "restart"]
    assert [r["resource"] for r in restart] == ["engine0"]
    back = float(restart[0]["end"])
    after = [r for r in rows if r["resource"] == "engine0" and float(r["start"]) >= back]
    assert {"weight_load", "prefill", "decode"} <= {r["activity"] for r in after}  # the new engine caught up
    assert min(int(r["version"]) for r in after if r["activity"] == "weight_load") >= 2


def test_engine_killed_during_the_weight_broadcast(ray_cluster: None, tmp_path: Path) -> None:
    """The broadcast of version 2 breaks (a dead rank): the survivor waits out the sync timeout, the group
    is rebuilt around it, the weights go out again, and the run carries on."""
    from runtime.settings import Faults
    from runtime.toy import run_toy_ray

    # engine 0 is sync rank 1: the trainer reaches it first and fails there, engine 1 never gets its bytes
    result = run_toy_ray(7, engines=2, seed=1, out_dir=tmp_path, faults=Faults(kill_engine_in_sync=(0, 2)),
                         sync_timeout_s=3.0, **SMALL)
    figures = _assert_nothing_lost_or_trained_twice(result, tmp_path, SMALL["group_size"])
    rows = read_metrics(tmp_path)
    waited = rows[1]["time"] - rows[0]["time"]  # step 1's weights are version 2: the broken broadcast
    print(f"\nengine killed in the broadcast: {figures}, restarts {result.engine_restarts}, survivor waited "
          f"{waited:.1f} s, {result.seconds:.1f} s")
    assert result.steps == result.version == 7 and result.engine_restarts == 1 and figures["lost"] == 0
    assert [r["step"] for r in rows] == list(range(7))
    assert waited >= 3.0  # the survivor sat out the sync timeout: that path was taken


def test_killed_trainer_resumes_to_the_uninterrupted_runs_step_and_version(ray_cluster: None,
                                                                            tmp_path: Path) -> None:
    from runtime.ray_loop import TrainerLost
    from runtime.settings import Faults
    from runtime.toy import run_toy_ray

    steps, kill = 8, 5
    common = {"engines": 2, "seed": 0, "checkpoint_every": 1, **SMALL}
    full = run_toy_ray(steps, out_dir=tmp_path / "full", **common)
    cut = tmp_path / "cut"
    with pytest.raises(TrainerLost, match=f"during step {kill}; .* checkpoint at version {kill}"):
        run_toy_ray(steps, out_dir=cut, faults=Faults(kill_trainer=kill), **common)
    record = json.loads((cut / "checkpoint.json").read_text())
    assert record["version"] == kill  # only the step in progress is lost
    saved = torch.load(cut / record["trainer"], weights_only=True)
    minibatches = 2  # TrainConfig's default
    assert {int(s["step"]) for s in saved["optimizer"]["state"].values()} == {kill * minibatches}
    assert all("exp_avg" in s and "exp_avg_sq" in s for s in saved["optimizer"]["state"].values())
    before = read_metrics(cut)
    assert [r["step"] for r in before] == list(range(kill))

    resumed = run_toy_ray(steps, out_dir=cut, resume=True, **common)
    print(f"\nuninterrupted: steps {full.steps}, version {full.version}, Adam steps {full.optimizer_steps}; "
          f"resumed from {resumed.first_step}: steps {resumed.steps}, version {resumed.version}, "
          f"Adam steps {resumed.optimizer_steps}")
    assert resumed.first_step == kill
    assert (resumed.steps, resumed.version) == (full.steps, full.version) == (steps, steps)
    # a fresh optimizer would count (steps - kill) * minibatches updates: Adam's state came back
    assert resumed.optimizer_steps == full.optimizer_steps == steps * minibatches
    after = read_metrics(cut)
    assert [r["step"] for r in after] == list(range(steps)) and after[:kill] == before  # continued, not rewritten
    figures = _assert_nothing_lost_or_trained_twice(resumed, cut, SMALL["group_size"])
    assert figures["lost"] == 0 and figures["trained"] == steps * SMALL["prompts_per_step"]


# -- the command line -------------------------------------------------------------------------------
PLAN = "traces/data/plans/toy-cpu.json"


def test_rlfleet_run_resume_continues_a_stopped_run(cli: Callable[..., Any], tmp_path: Path) -> None:
    out = tmp_path / "run"
    first = cli("run", PLAN, "--in-process", "--steps", "3", "--out", str(out), "--json")
    assert first.code == 0, first.err
    res = cli("run", PLAN, "--in-process", "--steps", "5", "--resume", str(out), "--json")
    assert res.code == 0, res.err
    summary = res.json()
    assert (summary["resumed_from"], summary["steps"], summary["version"]) == (3, 5, 5)
    assert [r["step"] for r in read_metrics(out)] == list(range(5))
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["trainer-000005.pt"]


def test_rlfleet_run_resume_refuses_what_it_cannot_continue(cli: Callable[..., Any], tmp_path: Path,
                                                           write: Callable[[str, str], Path]) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    res = cli("run", PLAN, "--in-process", "--steps", "4", "--resume", str(empty))
    assert res.code == 2 and "no checkpoint" in res.err and len(res.err.strip().splitlines()) == 1

    out = tmp_path / "run"
    assert cli("run", PLAN, "--in-process", "--steps", "2", "--out", str(out)).code == 0
    plan = json.loads(Path(PLAN).read_text())
    other = write("eta1.json", json.dumps({**plan, "staleness": 1}))
    res = cli("run", str(other), "--in-process", "--steps", "4", "--resume", str(out))
    assert res.code == 2 and "different run" in res.err and len(res.err.strip().splitlines()) == 1
    res = cli("run", PLAN, "--in-process", "--steps", "4", "--resume", str(out), "--seed", "7")
    assert res.code == 2 and "seed" in res.err
    res = cli("run", PLAN, "--in-process", "--steps", "4", "--resume", str(out), "--out", str(tmp_path / "else"))
    assert res.code == 2 and "--resume" in res.err
    res = cli("run", PLAN, "--in-process", "--steps", "2", "--resume", str(out))
    assert res.code == 2 and "at step 2 already" in res.err
    (out / "checkpoint.json").write_text("{not json")
    res = cli("run", PLAN, "--in-process", "--steps", "4", "--resume", str(out))
    assert res.code == 2 and "not a readable checkpoint" in res.err and len(res.err.strip().splitlines()) == 1
