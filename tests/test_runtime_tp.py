"""Tensor-parallel trainer ranks: real processes over gloo on loopback, checked against the tp=1 Trainer.

Two jobs: tp=2 (two ranks) and dp=2 x tp=2 (four ranks, a 2-D mesh). Each rank runs the scenarios and
saves what the tests compare with a plain `Trainer` run in this process on the same batches and seed.
The NCCL path on GPUs is wired the same way (runtime.tensor_parallel) but cannot run here.
"""

from __future__ import annotations

import json
import multiprocessing
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from test_runtime_parallel import MULTI_STEP, SEED, TOK, _assert_steps_equal, _assert_weights_equal, _batch, _model

from runtime.model import load_model
from runtime.parallel import DataParallelTrainer, host_dp_store, init_dp_group
from runtime.records import read_metrics, trainer_checkpoint_path
from runtime.tensor_parallel import check_tp, tp_plan
from runtime.trainer import Trainer
from runtime.trainer_worker import weights_sha256
from traces import SpecError

BATCHES = [_batch(s) for s in range(3)]
RESUMED = _batch(3)  # the step after the checkpoint: trained by a fresh rank that loaded it


def _steps(trainer: Trainer, batches: list[Any]) -> list[tuple[Any, dict[str, torch.Tensor]]]:
    """Each step's stats and the (full) weights after it; with tp every rank gathers together."""
    return [(trainer.train_step(b), {k: v.clone() for k, v in trainer.weights().items()}) for b in batches]


def _rank(rank: int, port: int, world: int, tp: int, out: str) -> None:
    torch.set_num_threads(1)
    init_dp_group(rank, world, "127.0.0.1", port, timeout_s=60)
    trainer = DataParallelTrainer(_model(), TOK.pad_id, MULTI_STEP, seed=SEED, tp=tp)
    q = trainer.model.model.layers[0].self_attn.q_proj.weight
    result: dict[str, Any] = {"steps": _steps(trainer, BATCHES), "local_q": tuple(q.to_local().shape),
                              "optimizer": trainer.checkpoint_state()["optimizer"]}  # gathered whole
    trainer.save_checkpoint(Path(out) / "checkpoint.pt")  # every rank calls; rank 0 writes
    fresh = DataParallelTrainer(_model(), TOK.pad_id, MULTI_STEP, seed=SEED, tp=tp)
    fresh.load_checkpoint(Path(out) / "checkpoint.pt")
    result["resumed"] = _steps(fresh, [RESUMED])
    if tp == 2 and world == 2:  # production dtype: one step, compared within float32 noise
        f32 = DataParallelTrainer(_model(torch.float32), TOK.pad_id, MULTI_STEP, seed=SEED, tp=tp)
        result["float32"] = _steps(f32, BATCHES[:1])
    torch.save(result, Path(out) / f"rank{rank}.pt")


def _job(out: Path, world: int, tp: int) -> list[dict[str, Any]]:
    store = host_dp_store("127.0.0.1", world, timeout_s=60)  # this process hosts it; the ranks join
    # forkserver: fresh processes forked from one server that imported torch and transformers once
    multiprocessing.get_context("forkserver").set_forkserver_preload(["runtime.parallel", "runtime.model"])
    mp.start_processes(_rank, args=(int(store.port), world, tp, str(out)), nprocs=world, join=True,
                       start_method="forkserver")
    return [{**torch.load(out / f"rank{r}.pt", weights_only=False), "dir": out} for r in range(world)]


@pytest.fixture(scope="module")
def tp2(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return _job(tmp_path_factory.mktemp("tp2"), world=2, tp=2)


@pytest.fixture(scope="module")
def dp2_tp2(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return _job(tmp_path_factory.mktemp("dp2tp2"), world=4, tp=2)


@pytest.fixture(scope="module")
def reference() -> tuple[Trainer, list[tuple[Any, dict[str, torch.Tensor]]]]:
    """The tp=1 `Trainer` on the same batches, model and seed (float64: see test_runtime_parallel)."""
    trainer = Trainer(_model(), TOK.pad_id, MULTI_STEP, seed=SEED)
    return trainer, _steps(trainer, BATCHES)


def test_tp2_steps_equal_tp1_steps(tp2: list[dict[str, Any]], reference: tuple[Trainer, Any]) -> None:
    trainer, want = reference
    for rank in tp2:
        _assert_steps_equal(rank["steps"], want)
    assert not torch.equal(want[0][1]["lm_head.weight"], _model().state_dict()["lm_head.weight"])  # it moved
    full_q = _model().model.layers[0].self_attn.q_proj.weight.shape
    assert [r["local_q"] for r in tp2] == [(full_q[0] // 2, full_q[1])] * 2  # each rank holds half the heads
    assert tp2[0]["steps"][0][1].keys() == trainer.weights().keys()  # engines get the same keys, unsharded
    for name, tensor in trainer.weights().items():
        assert tp2[0]["steps"][-1][1][name].shape == tensor.shape, name


def test_tp2_optimizer_state_gathers_to_tp1s(tp2: list[dict[str, Any]], reference: tuple[Trainer, Any]) -> None:
    want = reference[0].optimizer.state_dict()
    for rank in tp2:
        got = rank["optimizer"]
        assert got["param_groups"] == want["param_groups"]
        for i, state in want["state"].items():
            for key in ("exp_avg", "exp_avg_sq"):
                torch.testing.assert_close(got["state"][i][key], state[key], rtol=1e-5, atol=1e-8)


def test_tp2_checkpoint_loads_into_a_plain_trainer_and_back(tp2: list[dict[str, Any]],
                                                            reference: tuple[Trainer, Any]) -> None:
    plain = Trainer(_model(), TOK.pad_id, MULTI_STEP, seed=SEED)
    plain.load_checkpoint(tp2[0]["dir"] / "checkpoint.pt")
    assert plain.version == len(BATCHES)
    _assert_weights_equal(plain.weights(), tp2[1]["steps"][-1][1], atol=0.0)
    # a tp=2 rank that loaded the file trains the next step as the tp=1 trainer that never stopped
    trainer = reference[0]
    want = _steps(trainer, [RESUMED])
    for rank in tp2:
        _assert_steps_equal(rank["resumed"], want)


def test_tp2_float32_step_equals_tp1_within_float32_noise(tp2: list[dict[str, Any]]) -> None:
    """Row-parallel sums change float32's summation order; Adam's first step turns that into ~0.6% of the
    largest weight move on near-zero gradient elements (measured: 1.2e-4 against 0.02). float64 agrees to
    ~1e-14 for two steps and 5e-9 after the third (the same amplification), hence the float64 tests."""
    trainer = Trainer(_model(torch.float32), TOK.pad_id, MULTI_STEP, seed=SEED)
    want = _steps(trainer, BATCHES[:1])
    start = _model(torch.float32).state_dict()
    moved = max(float((w - start[k]).abs().max()) for k, w in want[0][1].items())
    for rank in tp2:
        _assert_weights_equal(rank["float32"][0][1], want[0][1], atol=0.01 * moved)


def test_dp2_x_tp2_steps_equal_tp1_steps(dp2_tp2: list[dict[str, Any]]) -> None:
    """Four ranks: rows split over the dp coordinate, heads over tp; every rank ends with the tp=1 weights."""
    trainer = Trainer(_model(), TOK.pad_id, MULTI_STEP, seed=SEED)
    want = _steps(trainer, BATCHES)
    for rank in dp2_tp2:
        _assert_steps_equal(rank["steps"], want)
    want_resumed = _steps(trainer, [RESUMED])
    for rank in dp2_tp2:
        _assert_steps_equal(rank["resumed"], want_resumed)


def test_tp_that_cannot_split_the_heads_is_refused() -> None:
    check_tp(2, heads=4, kv_heads=2, intermediate=256)
    with pytest.raises(SpecError, match=r"tp=4 cannot split the model's 2 KV heads"):
        check_tp(4, heads=4, kv_heads=2, intermediate=256)
    with pytest.raises(SpecError, match=r"tp=3 cannot split the model's 4 attention heads"):
        check_tp(3, heads=4, kv_heads=2, intermediate=255)


def test_a_plan_style_the_trainer_does_not_apply_is_refused() -> None:
    model = _model()
    assert set(tp_plan(model)) == set(model.config.base_model_tp_plan)
    model.config.base_model_tp_plan = {**model.config.base_model_tp_plan, "norm": "sequence_parallel"}
    with pytest.raises(SpecError, match="sequence_parallel"):
        tp_plan(model)
    model.config.base_model_tp_plan = {}
    with pytest.raises(SpecError, match="no tensor-parallel plan"):
        tp_plan(model)


PLAN = json.loads(Path("traces/data/plans/toy-cpu.json").read_text())
TP2_ONE_ENGINE = {**PLAN, "rollout": [{"gpu_type": "CPU", "tp": 1, "instances": 1}],
                  "trainer": {"gpu_type": "CPU", "dp": 1, "tp": 2, "pp": 1}}


def test_rlfleet_run_trains_on_two_tensor_parallel_ranks(cli: Callable[..., Any], write: Callable[[str, str], Path],
                                                         tmp_path: Path) -> None:
    """Real Ray on loopback: two rank actors split the model; the engine loads the gathered (full) weights
    every step; rank 0 writes the checkpoint it gathered with the other rank called in."""
    plan, out, steps = write("tp2.json", json.dumps(TP2_ONE_ENGINE)), tmp_path / "run", 2
    res = cli("run", str(plan), "--steps", str(steps), "--out", str(out), "--json")
    assert res.code == 0, res.err
    run = res.json()
    print(f"\ntp=2: {steps} steps in {run['seconds']:.1f} s, ranks "
          f"{[(r['rank'], r['pid'], r['steps_trained']) for r in run['trainer_ranks']]}")
    assert (run["executor"], run["trainer_dp"], run["trainer_tp"], run["version"]) == ("ray-local", 1, 2, steps)
    ranks = run["trainer_ranks"]
    assert [r["rank"] for r in ranks] == [0, 1] and len({r["pid"] for r in ranks}) == 2
    assert {r["steps_trained"] for r in ranks} == {steps} and {r["version"] for r in ranks} == {steps}
    assert ranks[0]["weights_sha256"] == ranks[1]["weights_sha256"]  # both gathered the same full weights
    assert run["max_staleness"] <= run["staleness_bound"]  # the engine took each version's weights
    assert [r["step"] for r in read_metrics(out)] == list(range(steps))
    plain = Trainer(load_model(out / "initial_model"), TOK.pad_id)
    plain.load_checkpoint(trainer_checkpoint_path(out, steps))  # whole tensors, the plain Trainer's layout
    assert (plain.version, plain.optimizer_steps()) == (steps, steps * plain.config.minibatches)
    assert weights_sha256(plain.weights()) == ranks[0]["weights_sha256"]


@pytest.mark.parametrize(("trainer", "message"), [
    ({"dp": 1, "tp": 1, "pp": 2}, "trainer pp=2: pipeline parallelism is not built"),
    ({"dp": 1, "tp": 4, "pp": 1}, "trainer tp=4 cannot split the model's 2 KV heads"),
])
def test_rlfleet_run_refuses_a_trainer_shape_it_cannot_run_before_ray_starts(
        cli: Callable[..., Any], write: Callable[[str, str], Path], trainer: dict[str, int], message: str) -> None:
    plan = write("bad.json", json.dumps({**PLAN, "trainer": {"gpu_type": "CPU", **trainer}}))
    # room for the shape on the cluster, so the refusal is the trainer's own
    cluster = write("eight.yaml", "name: eight\nnode_groups:\n- {gpu_type: CPU, nodes: 1, gpus_per_node: 8}\n")
    res = cli("run", str(plan), "--cluster", str(cluster), "--steps", "1")
    assert res.code == 2 and message in res.err and len(res.err.strip().splitlines()) == 1
    assert "ray" not in sys.modules or not sys.modules["ray"].is_initialized()
