"""Data-parallel trainer ranks: real processes over gloo on loopback, checked against the dp=1 Trainer.

One job of two ranks (separate processes) runs every scenario (process start-up, torch and transformers imports,
dominates a test's time on 2 cores); the tests then compare what each rank saved with a plain
`Trainer` run in this process on the same batches.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import random
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from runtime.model import CharTokenizer, build_model, tiny_llama_config
from runtime.parallel import DataParallelTrainer, Wrap, host_dp_store, init_dp_group, minibatch_rows, shard_rows
from runtime.trainer import Rollout, StepStats, TrainConfig, Trainer

DP = 2
SEED = 3
TOK = CharTokenizer()
# lr large enough that a step visibly moves the weights; entropy bonus, lr decay and the behaviour cap on
MULTI_STEP = TrainConfig(lr=1e-2, decay_steps=4, minibatches=2, entropy_coef=0.01, behav_weight_cap=2.0)
# one row per minibatch: in each, one rank holds the row and the other has nothing to train on
ONE_ROW = TrainConfig(lr=1e-2, minibatches=12)


def _batch(step: int, groups: int = 4, per_group: int = 3, long_groups: int = 2) -> list[Rollout]:
    """Rollouts of unequal lengths; the first `long_groups` groups have long responses, so ranks' token
    counts differ. Versions lag up to 2 behind `step`, and behaviour logprobs are spread so that some
    tokens are clipped and some dropped."""
    rng = random.Random(step * 7 + groups)
    out = []
    for g in range(groups):
        prompt = tuple(TOK.encode(f"{rng.randint(0, 99)}+{rng.randint(0, 99)}="))
        for _ in range(per_group):
            n = rng.randint(8, 20) if g < long_groups else rng.randint(1, 4)
            tokens = tuple(rng.randint(3, TOK.vocab_size - 1) for _ in range(n))
            out.append(Rollout(prompt, tokens, tuple(rng.uniform(-4.0, -1.5) for _ in range(n)),
                               tuple(max(step - rng.randint(0, 2), 0) for _ in range(n)),
                               float(rng.random() < 0.5), group=100 + g))
    return out


# Parity is checked in float64: Adam's first steps divide each gradient element by its own magnitude, so on
# near-zero elements float32's summation-order noise (rows split over ranks) becomes ~0.1% of the lr in the
# weights; in float64 dp=2 matches dp=1 to ~1e-13, which shows the split and normalisation are exact.
# The float32 scenario is the production dtype, checked with a tolerance that noise allows.
SCENARIOS: dict[str, tuple[TrainConfig, torch.dtype, Wrap, list[list[Rollout]]]] = {
    "multi_step": (MULTI_STEP, torch.float64, "ddp", [_batch(s) for s in range(3)]),
    "one_row": (ONE_ROW, torch.float64, "ddp", [_batch(s) for s in range(2)]),
    "float32": (MULTI_STEP, torch.float32, "ddp", [_batch(0)]),
    "fsdp": (MULTI_STEP, torch.float64, "fsdp", [_batch(s) for s in range(3)]),
}


def _model(dtype: torch.dtype = torch.float64) -> torch.nn.Module:
    return build_model(tiny_llama_config(TOK), seed=0).to(dtype)


def _expect_error(trainer: DataParallelTrainer, batch: list[Rollout]) -> str:
    try:
        trainer.train_step(batch)
    except ValueError as exc:
        return str(exc)
    return "no error"


def _rank(rank: int, port: int, out: str) -> None:
    """One data-parallel rank: every scenario, then the refused batches; saves what the tests compare."""
    torch.set_num_threads(1)
    init_dp_group(rank, DP, "127.0.0.1", port, timeout_s=60)
    result: dict[str, Any] = {}
    for name, (config, dtype, wrap, batches) in SCENARIOS.items():
        trainer = DataParallelTrainer(_model(dtype), TOK.pad_id, config, seed=SEED, wrap=wrap)
        result[name] = {"steps": _run_steps(trainer, batches)}  # fsdp: all ranks gather the weights
        if wrap == "ddp":
            result[name]["optimizer"] = trainer.optimizer.state_dict()
        else:  # elements this rank holds, against the model's: sharded, not replicated
            result[name]["held"] = sum(p.to_local().numel() for p in trainer.model.parameters())
            try:
                trainer.save_checkpoint(Path(out) / "never.pt")
            except NotImplementedError as exc:
                result[name]["checkpoint"] = str(exc)
        if name == "multi_step" and rank == 0:
            trainer.save_checkpoint(Path(out) / "checkpoint.pt")  # rank 0 writes, as the Ray driver asks it to
    trainer = DataParallelTrainer(_model(), TOK.pad_id, MULTI_STEP, seed=SEED)
    result["odd_groups"] = _expect_error(trainer, _batch(0, groups=3))
    result["different_batches"] = _expect_error(trainer, _batch(rank))
    result["version_after_errors"] = trainer.version
    result["different_seeds"] = _expect_error(DataParallelTrainer(_model(), TOK.pad_id, MULTI_STEP, seed=rank),
                                              _batch(0))
    torch.save(result, Path(out) / f"rank{rank}.pt")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("dp")
    store = host_dp_store("127.0.0.1", DP, timeout_s=60)  # this process hosts it; the ranks join
    # forkserver: fresh single-threaded processes like spawn, but forked from a server that imported torch
    # and transformers once (~10 s on 2 cores) rather than once per rank, concurrently (~20 s)
    multiprocessing.get_context("forkserver").set_forkserver_preload(["runtime.parallel", "runtime.model"])
    mp.start_processes(_rank, args=(int(store.port), str(out)), nprocs=DP, join=True, start_method="forkserver")
    return [{**torch.load(out / f"rank{r}.pt", weights_only=False), "dir": out} for r in range(DP)]


def _reference(name: str) -> tuple[Trainer, list[tuple[StepStats, dict[str, torch.Tensor]]]]:
    """The dp=1 `Trainer` on the same batches, with the same model and seed."""
    config, dtype, _, batches = SCENARIOS[name]
    trainer = Trainer(_model(dtype), TOK.pad_id, config, seed=SEED)
    return trainer, _run_steps(trainer, batches)


def _run_steps(trainer: Trainer | DataParallelTrainer, batches: list[Any]
               ) -> list[tuple[StepStats, dict[str, torch.Tensor]]]:
    """Each step's stats and the weights after it."""
    steps = []
    for batch in batches:
        stats = trainer.train_step(batch)
        steps.append((stats, {k: v.clone() for k, v in trainer.weights().items()}))
    return steps


def _assert_steps_equal(got: list[tuple[StepStats, dict[str, torch.Tensor]]],
                        want: list[tuple[StepStats, dict[str, torch.Tensor]]]) -> None:
    for (stats, weights), (want_stats, want_weights) in zip(got, want, strict=True):
        _assert_weights_equal(weights, want_weights)
        _assert_stats_equal(stats, want_stats)


def _assert_weights_equal(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], atol: float = 1e-7) -> None:
    assert got.keys() == want.keys()
    for name, tensor in want.items():
        diff = float((got[name] - tensor).abs().max())
        assert diff <= atol, f"{name}: max difference {diff:.3g} over {atol:.3g}"


def _assert_stats_equal(got: StepStats, want: StepStats, rel: float = 1e-6) -> None:
    """Loss statistics are float32 sums (the loss is computed in float32 whatever the model's dtype)."""
    exact = ("step", "samples", "tokens", "lags")
    for field in dataclasses.fields(StepStats):
        a, b = getattr(got, field.name), getattr(want, field.name)
        if field.name in exact:
            assert a == b, field.name
        else:
            assert a == pytest.approx(b, rel=rel, abs=rel), field.name


def test_batches_split_unequal_tokens_and_exercise_clipping_and_dropping() -> None:
    """The parity tests below mean something only if ranks' token counts differ and the loss's branches fire."""
    batch = _batch(0)
    tokens = [sum(len(batch[i].tokens) for i in shard_rows([r.group for r in batch], r, DP)) for r in range(DP)]
    assert tokens[0] > 2 * tokens[1]
    stats = _reference("multi_step")[1][-1][0]
    assert stats.clip_fraction > 0 and 0 < stats.dropped_fraction < 1


def test_dp2_step_equals_dp1_step(ranks: list[dict[str, Any]]) -> None:
    _, want = _reference("multi_step")
    for rank in ranks:
        stats, weights = rank["multi_step"]["steps"][0]
        _assert_weights_equal(weights, want[0][1])
        _assert_stats_equal(stats, want[0][0])
    assert not torch.equal(want[0][1]["lm_head.weight"], _model().state_dict()["lm_head.weight"])  # it moved


def test_dp2_stays_equal_over_steps_optimizer_state_too(ranks: list[dict[str, Any]]) -> None:
    trainer, want = _reference("multi_step")
    for rank in ranks:
        _assert_steps_equal(rank["multi_step"]["steps"], want)
        got_opt, want_opt = rank["multi_step"]["optimizer"], trainer.optimizer.state_dict()
        assert got_opt["param_groups"] == want_opt["param_groups"]  # lr schedule and step count
        for i, state in want_opt["state"].items():
            for key in ("exp_avg", "exp_avg_sq"):
                torch.testing.assert_close(got_opt["state"][i][key], state[key], rtol=1e-5, atol=1e-8)


def test_minibatches_where_a_rank_holds_no_rows(ranks: list[dict[str, Any]]) -> None:
    _, want = _reference("one_row")
    for rank in ranks:
        _assert_steps_equal(rank["one_row"]["steps"], want)


def test_fsdp_steps_equal_dp1_steps(ranks: list[dict[str, Any]]) -> None:
    _, want = _reference("fsdp")
    for rank in ranks:
        _assert_steps_equal(rank["fsdp"]["steps"], want)
        assert "torch.distributed.checkpoint" in rank["fsdp"]["checkpoint"]
        assert rank["fsdp"]["held"] <= sum(p.numel() for p in _model().parameters()) // DP + 1000


def test_rank0_checkpoint_loads_into_a_plain_trainer(ranks: list[dict[str, Any]]) -> None:
    trainer = Trainer(_model(), TOK.pad_id, MULTI_STEP, seed=SEED)
    trainer.load_checkpoint(ranks[0]["dir"] / "checkpoint.pt")
    assert trainer.version == len(SCENARIOS["multi_step"][3])
    _assert_weights_equal(trainer.weights(), ranks[1]["multi_step"]["steps"][-1][1], atol=0.0)


def test_dp2_float32_step_equals_dp1_within_float32_noise(ranks: list[dict[str, Any]]) -> None:
    _, want = _reference("float32")
    start = _model(torch.float32).state_dict()
    moved = max(float((w - start[k]).abs().max()) for k, w in want[0][1].items())
    for rank in ranks:
        stats, weights = rank["float32"]["steps"][0]
        _assert_weights_equal(weights, want[0][1], atol=0.01 * moved)  # noise: ~0.1% of the step measured
        _assert_stats_equal(stats, want[0][0], rel=1e-5)


def test_bad_batches_are_refused_on_every_rank(ranks: list[dict[str, Any]]) -> None:
    for rank in ranks:
        assert "3 GRPO groups" in rank["odd_groups"] and "multiple of 2" in rank["odd_groups"]
        assert "different batches" in rank["different_batches"]
        assert "differ in seed" in rank["different_seeds"]
        assert rank["version_after_errors"] == 0  # nothing was trained


def test_shard_rows_keeps_groups_whole_and_covers_the_batch() -> None:
    groups = [7, 7, 3, 3, 3, 9, 1, 1]  # order of first appearance: 7, 3, 9, 1
    shards = [shard_rows(groups, r, 2) for r in range(2)]
    assert shards == [(0, 1, 2, 3, 4), (5, 6, 7)]
    with pytest.raises(ValueError, match="multiple of 3"):
        shard_rows(groups, 0, 3)
    with pytest.raises(ValueError, match="empty"):
        shard_rows([], 0, 2)


def test_minibatch_rows_cover_every_row_once() -> None:
    parts = minibatch_rows(10, 3, seed=SEED, step=4)
    assert len(parts) == 3 and sorted(torch.cat(parts).tolist()) == list(range(10))
    assert len(minibatch_rows(2, 5, seed=SEED, step=0)) == 2  # never more minibatches than rows


def test_a_rank_needs_its_process_group_first() -> None:
    with pytest.raises(RuntimeError, match="init_dp_group"):
        DataParallelTrainer(_model(), TOK.pad_id)
