"""Mechanisms of the RL step loop, each a field, each moving the simulated step the way (and about as
far as) a cited public source shows: fractional staleness, streaming training, DAPO's dynamic
sampling, the reference-model pass, rollout-side logprobs, colocated offload and sleep levels."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim import simulate
from sim.breakdown import mean_phases
from traces import Cluster, CostModel, Plan, RolloutGroup, SpecError, TrainerGroup, Workload, get_gpu, get_model
from traces.costmodel.roofline import train_state_parts
from traces.io import validate
from traces.lengths import LengthDist
from traces.plan import Offload
from traces.staleness import CapacityController, admission_cap, lag_bound
from traces.workload import DynamicSampling

CM = CostModel.roofline_only()
CLUSTER = Cluster(name="c", node_groups=({"gpu_type": "H800", "nodes": 1}, {"gpu_type": "H20", "nodes": 1}))
LONGTAIL = LengthDist(kind="lognormal", mean=600, sigma=0.8, cap=4096)


def _run(mode: str = "sync", eta: float = 0, *, dp: int = 8, chunks: int = 1, dapo: DynamicSampling | None = None,
         steps: int = 5, token_level: bool = False, **workload: object):  # type: ignore[no-untyped-def]
    w = Workload(model=get_model("qwen2.5-1.5b"), prompts_per_step=32, group_size=8, mode=mode, staleness=eta,
                 ppo_minibatches=4, prompt_len=LengthDist(kind="fixed", value=128), response_len=LONGTAIL,
                 stream_chunks=chunks, dynamic_sampling=dapo, **workload)  # type: ignore[arg-type]
    plan = Plan(mode=mode, staleness=eta, trainer=TrainerGroup(gpu_type="H800", dp=dp),
                rollout=(RolloutGroup(gpu_type="H20", instances=8, tp=1),))
    r = simulate(CLUSTER, w, plan, CM, steps=steps, seed=0, token_level=token_level)
    return r, mean_phases(r.timeline, eta)


# ---- fractional staleness (verl's async_training.staleness_threshold) --------------------------

def test_a_fractional_bound_admits_part_of_a_batch_ahead_and_lags_one_version() -> None:
    """staleness 0.5: floor((0.5 + v + 1) B) samples by version v, trained at most ceil(0.5) = 1 late;
    whole bounds are AReaL's rule unchanged."""
    assert admission_cap(0.5, 0, 10) == 15 and admission_cap(0.5, 3, 10) == 45
    assert admission_cap(0.1, 0, 10) == 11  # 1.1 * 10 is 11.000000000000002 in floats; 0.1 + 1 likewise
    assert [admission_cap(2, v, 7) for v in range(3)] == [21, 28, 35]
    assert (lag_bound(0), lag_bound(0.25), lag_bound(1), lag_bound(1.5)) == (0, 1, 1, 2)
    ctl: CapacityController[int] = CapacityController(batch=4, eta=0.5)
    assert ctl.allowance() == 6


def test_half_a_batch_of_staleness_takes_most_of_the_async_gain() -> None:
    """ROLL Flash (Lu et al. 2025, arXiv 2510.11345: AsyncRatio bounds how far rollout runs ahead) finds
    near-maximal gains already at modest asynchrony: here half a batch ahead gets over half of what a
    whole version ahead gains over sync, with every token at most one version old, fewer of them stale."""
    sync = _run("sync", 0)[0].samples_per_s
    half, _ = _run("async", 0.5)
    one = _run("async", 1)[0].samples_per_s
    assert sync < half.samples_per_s < one
    assert (half.samples_per_s - sync) / (one - sync) > 0.5
    assert half.max_staleness == 1
    stale = half.staleness_hist.get(1, 0) / sum(half.staleness_hist.values())
    full, _ = _run("async", 1)
    assert stale < full.staleness_hist.get(1, 0) / sum(full.staleness_hist.values())
    ref, _ = _run("async", 0.5, token_level=True)  # the token-level reference applies the same rule
    assert ref.samples_per_s == pytest.approx(half.samples_per_s, rel=1e-9)
    assert (ref.trained_ids == half.trained_ids).all()


# ---- streaming training per chunk ---------------------------------------------------------------

def test_streaming_training_hides_all_but_the_last_chunk_behind_generation() -> None:
    """StreamRL (Zhong et al. 2025, arXiv 2504.15930) streams completed samples to the trainer, which
    starts before the batch is done. In a sync step of generation G and trainer work T, c chunks can
    save at most (c - 1)/c T (the last chunk trains after the last sample); a long tail lets most of
    that happen (here at least 40%)."""
    _, one = _run("sync", 0, dp=1)
    trainer = one["logprob"] + one["train"]
    for chunks in (2, 4):
        r, streamed = _run("sync", 0, dp=1, chunks=chunks)
        saved = one["step"] - streamed["step"]
        bound = (chunks - 1) / chunks * trainer
        assert 0.4 * bound < saved <= bound + 1e-6
        assert streamed["logprob"] + streamed["train"] == pytest.approx(trainer, rel=1e-6)  # same work, earlier
        assert r.max_staleness == 0  # still on-policy: the weights move once per step
        from sim.breakdown import step_phases

        steps = step_phases(r.timeline)  # waits between chunks count as wait: the phases still add up
        parts = steps[["wait", "switch", "logprob", "train", "sync"]].sum(axis=1)
        assert (abs(parts - steps.step) < 1e-6).all()
    ref, _ = _run("sync", 0, dp=1, chunks=4, token_level=True)
    assert ref.mean_step_s == pytest.approx(r.mean_step_s, rel=1e-9)


# ---- DAPO dynamic sampling ------------------------------------------------------------------------

def test_dynamic_sampling_generates_one_over_the_pass_rate() -> None:
    """GRESO (Zheng et al. 2025, arXiv 2506.02177) skips before rollout the zero-variance prompts that
    DAPO's dynamic sampling (Yu et al. 2025, arXiv 2503.14476) generates and then drops, and reports
    up to 2.4x faster rollout: a pass rate near 1/2.4. At that rate the simulated sync step generates
    2.4x the samples it trains, and its generation phase takes about 2.4x as long."""
    plain, base = _run("sync", 0)
    r, dapo = _run("sync", 0, dapo=DynamicSampling(pass_rate=1 / 2.4))
    assert r.trained_samples == plain.trained_samples
    # exactly as many groups as it took this seed's draws to pass the trained ones (421 for 160: 2.63)
    passed = np.cumsum(np.random.default_rng([0, 1]).random(1000) < 1 / 2.4)
    groups = int(np.searchsorted(passed, r.trained_samples // 8)) + 1
    assert r.trained_samples + r.dropped == 8 * groups
    generated = groups * 8 / r.trained_samples
    assert generated == pytest.approx(2.4, rel=0.1)
    assert dapo["wait"] / base["wait"] == pytest.approx(generated, rel=0.1)  # generation-bound: time ~ samples
    ref, _ = _run("sync", 0, dapo=DynamicSampling(pass_rate=1 / 2.4), token_level=True)
    assert ref.mean_step_s == pytest.approx(r.mean_step_s, rel=1e-9)


def test_oversampling_generates_ahead_and_drops_the_surplus() -> None:
    """verl's DAPO recipe generates gen_batch_size prompts (3x the train batch in its scripts) and keeps
    the first train_batch_size that pass: with every group passing and 2x over-generation, twice the
    trained samples are generated; at pass rate 1/2, generating 2x ahead fills the batch in fewer
    rounds than replacing drops as they are known, so the step is shorter."""
    r, _ = _run("sync", 0, dapo=DynamicSampling(pass_rate=1.0, oversample=2))
    assert r.dropped == r.trained_samples
    assert r.max_staleness == 0  # the surplus is dropped, not trained a step late
    replace = _run("sync", 0, dapo=DynamicSampling(pass_rate=0.5))[0].mean_step_s
    ahead = _run("sync", 0, dapo=DynamicSampling(pass_rate=0.5, oversample=2))[0].mean_step_s
    assert ahead < replace


# ---- reference pass and rollout-side logprobs ------------------------------------------------------

def test_the_reference_pass_is_one_more_forward_a_third_of_training() -> None:
    """Miles on MI300X (lm-sys blog 2026-03-17, calibration rows C38/C39): log-prob 31.5 s against
    actor training 95.3 s, 1 : 3.0, a forward against forward + backward. The KL reference's pass is
    one more such forward: the logprob phase doubles, training is unchanged."""
    _, base = _run("sync", 0)
    assert base["train"] / base["logprob"] == pytest.approx(95.3 / 31.53, rel=0.15)
    _, kl = _run("sync", 0, kl_reference=True)
    assert kl["logprob"] == pytest.approx(2 * base["logprob"], rel=1e-6)
    assert kl["train"] == pytest.approx(base["train"], rel=1e-6)


def test_rollout_logprobs_skip_the_recompute_pass() -> None:
    """verl's rollout.calculate_log_probs (AReaL: use_decoupled_loss off) takes the engines' logprobs as
    the old policy's: the trainer's recompute pass (C38: 8% of Miles' step) goes, and the step with it."""
    _, base = _run("sync", 0)
    _, skip = _run("sync", 0, rollout_logprobs=True)
    assert skip["logprob"] == 0.0
    assert base["step"] - skip["step"] == pytest.approx(base["logprob"], rel=1e-3)
    _, kl = _run("sync", 0, rollout_logprobs=True, kl_reference=True)  # the reference still runs
    assert kl["logprob"] == pytest.approx(base["logprob"], rel=1e-6)


# ---- colocated offload and engine sleep -------------------------------------------------------------

def _colocated(offload: Offload, steps: int = 2):  # type: ignore[no-untyped-def]
    # 256 samples an engine, long answers: the KV cache binds once the trainer's states stay in HBM
    w = Workload(model=get_model("qwen2.5-7b"), prompts_per_step=256, group_size=8, mode="colocated",
                 prompt_len=LengthDist(kind="fixed", value=128),
                 response_len=LengthDist(kind="lognormal", mean=4000, sigma=0.8, cap=8192))
    plan = Plan(mode="colocated", rollout=(RolloutGroup(gpu_type="H800", instances=8),),
                trainer=TrainerGroup(gpu_type="H800", dp=8, zero_stage=1), offload=offload)
    r = simulate(CLUSTER, w, plan, CM, steps=steps, seed=0)
    return r, mean_phases(r.timeline, 0)


def test_offload_moves_what_it_names_over_the_host_link() -> None:
    """A hand-over copies bytes over PCIe (pinned copies at Efficiency.host_copy of the link): mixed-
    precision Adam holds 2 + 2 + 12 bytes per parameter (ZeRO, Rajbhandari et al. 2020), so keeping
    the optimizer states in HBM cuts the trainer's copy to a quarter (ZeRO-1 shards them: less
    here) and shortens the hand-overs, while the states kept shrink the engine's KV cache and so the
    batch it runs. vLLM's sleep level 1 copies the engine's weights, level 2 discards them."""
    model, gpu = get_model("qwen2.5-7b"), CLUSTER.gpu("H800")
    eff = CM.efficiency
    full, keep_opt = _colocated(Offload()), _colocated(Offload(optimizer=False))
    weights, grads, optim = (float(x) for x in train_state_parts(model, 8, 1, 1, zero_stage=1))
    per_switch = full[1]["switch"] / 2
    assert per_switch == pytest.approx(eff.switch_fixed_s + (weights + grads + optim)
                                       / (gpu.host_bytes_per_s * eff.host_copy), rel=1e-6)
    assert keep_opt[1]["switch"] / 2 == pytest.approx(eff.switch_fixed_s + max(weights + grads, model.weight_bytes)
                                                      / (gpu.host_bytes_per_s * eff.host_copy), rel=1e-6)
    keep_all = _colocated(Offload(params=False, grads=False, optimizer=False))
    assert keep_all[1]["switch"] < keep_opt[1]["switch"] < full[1]["switch"]
    assert keep_all[1]["wait"] > 1.02 * full[1]["wait"]  # a smaller KV cache: fewer sequences at once
    level2 = float(CM.colocate_switch(gpu, model, 1, 8, 1, 1, zero_stage=1, offload=(False, False, False),
                                      engine_sleep=2).seconds)
    level1 = float(CM.colocate_switch(gpu, model, 1, 8, 1, 1, zero_stage=1, offload=(False, False, False)).seconds)
    assert level2 == eff.switch_fixed_s < level1


def test_a_level_one_wake_takes_what_vllm_reports() -> None:
    """vLLM's sleep-mode blog (blog.vllm.ai 2025-10-26) wakes models of 0.6B to 235B from level 1 in
    0.1 to 6 s on A4000 to A100: weights back over PCIe. The engine's side of a hand-over here, a
    72B model over TP4 on A100 (36 GB a GPU) and an 8B one on one, lands in that range."""
    a100 = get_gpu("A100-80G")
    for name, tp in (("qwen2.5-72b", 4), ("llama-3.1-8b", 1)):
        wake = float(CM.colocate_switch(a100, get_model(name), tp, 1, 1, 1, offload=(False, False, False)).seconds)
        assert 0.1 <= wake <= 6.0


# ---- bad input: one line naming the field ------------------------------------------------------------

@pytest.mark.parametrize(("data", "field"), [
    ({"staleness": -0.5, "mode": "async"}, "staleness"),
    ({"staleness": 0.5, "mode": "sync"}, "staleness"),
    ({"stream_chunks": 3}, "stream_chunks"),
    ({"stream_chunks": 2, "ppo_minibatches": 2, "mode": "colocated"}, "stream_chunks"),
    ({"dynamic_sampling": {"pass_rate": 0}}, "pass_rate"),
    ({"dynamic_sampling": {"pass_rate": 0.5, "oversample": 0.5}}, "oversample"),
    ({"dynamic_sampling": {"rate": 0.5}}, "dynamic_sampling"),
])
def test_bad_workload_mechanisms_are_one_line(data: dict[str, object], field: str) -> None:
    base = {"model": "qwen2.5-1.5b", "prompts_per_step": 32, "prompt_len": {"kind": "fixed", "value": 128},
            "response_len": {"kind": "fixed", "value": 256}, "ppo_minibatches": 4}
    with pytest.raises(SpecError) as err:
        validate(Workload, {**base, **data}, "w.yaml")
    assert field in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(("data", "field"), [
    ({"offload": {"params": False}}, "offload"),
    ({"mode": "colocated", "offload": {"engine_sleep": 3}}, "engine_sleep"),
    ({"staleness": float("nan"), "mode": "async"}, "staleness"),
])
def test_bad_plan_mechanisms_are_one_line(data: dict[str, object], field: str) -> None:
    base = {"rollout": [{"gpu_type": "H20", "instances": 2}], "trainer": {"gpu_type": "H800", "dp": 8}}
    with pytest.raises(SpecError) as err:
        validate(Plan, {**base, **data}, "p.json")
    assert field in str(err.value) and "\n" not in str(err.value)


def test_a_trainer_that_does_not_fit_beside_an_awake_engine_is_refused() -> None:
    with pytest.raises(SpecError, match="engine_sleep 0"):
        _colocated(Offload(engine_sleep=0), steps=1)


@pytest.mark.parametrize(("text", "field"), [
    ("dynamic_sampling: {pass_rate: 1.5}\n", "pass_rate"),
    ("mode: async\nstaleness: .nan\n", "staleness"),
    ("stream_chunks: 3\n", "stream_chunks"),
])
def test_the_cli_refuses_bad_mechanism_fields_with_exit_2(cli, write, text: str, field: str) -> None:  # type: ignore[no-untyped-def]
    base = ("model: qwen2.5-1.5b\nprompts_per_step: 32\nppo_minibatches: 4\n"
            "prompt_len: {kind: fixed, value: 128}\nresponse_len: {kind: fixed, value: 256}\n")
    res = cli("validate", "--workload", str(write("w.yaml", base + text)))
    assert res.code == 2 and "Traceback" not in res.err
    lines = res.err.strip().splitlines()
    assert len(lines) == 1 and field in lines[0], res.err


def test_a_simulated_plan_with_an_awake_engine_and_too_little_memory_exits_2(cli, write) -> None:  # type: ignore[no-untyped-def]
    cluster = write("c.yaml", "name: c\nnode_groups:\n  - {gpu_type: H800, nodes: 1}\n")
    workload = write("w.yaml", "model: qwen2.5-7b\nprompts_per_step: 8\nmode: colocated\n"
                               "prompt_len: {kind: fixed, value: 128}\nresponse_len: {kind: fixed, value: 256}\n")
    plan = write("p.json", Plan(mode="colocated", rollout=(RolloutGroup(gpu_type="H800", instances=8),),
                                trainer=TrainerGroup(gpu_type="H800", dp=8),
                                offload=Offload(engine_sleep=0)).to_json())
    res = cli("simulate", "--cluster", str(cluster), "--workload", str(workload), "--plan", str(plan), "--steps", "1")
    assert res.code == 2 and "engine_sleep 0" in res.err and len(res.err.strip().splitlines()) == 1, res.err


def test_a_fractional_bound_exports_to_verl_not_to_areal() -> None:
    """verl's staleness_threshold is a fraction of a batch; AReaL's max_head_offpolicyness whole versions."""
    from planner.exports import areal

    cluster = Cluster(name="c", node_groups=({"gpu_type": "H800", "nodes": 2},))
    w = Workload(model=get_model("qwen2.5-1.5b"), prompts_per_step=32, prompt_len=LengthDist(kind="fixed", value=8),
                 response_len=LengthDist(kind="fixed", value=8), staleness=0.5)
    plan = Plan(mode="async", staleness=0.5, rollout=(RolloutGroup(gpu_type="H800", instances=8, nodes=(0,)),),
                trainer=TrainerGroup(gpu_type="H800", dp=8, nodes=(1,)))
    with pytest.raises(SpecError, match="max_head_offpolicyness"):
        areal.config(plan, cluster, w, ["n0", "n1"])


def test_running_out_of_drawn_samples_is_one_line_not_a_hang(monkeypatch: pytest.MonkeyPatch) -> None:
    """Draws that a pass rate exhausts (here: only as many as are trained, none for the drops) end the
    run with one line, whether the queue sampler (a process that never ends) runs or not."""
    import importlib

    monkeypatch.setattr(importlib.import_module("sim.simulate"), "_samples_to_draw", lambda workload, trained: trained)
    w = Workload(model=get_model("qwen2.5-1.5b"), prompts_per_step=8, mode="sync",
                 prompt_len=LengthDist(kind="fixed", value=16), response_len=LengthDist(kind="fixed", value=16),
                 dynamic_sampling=DynamicSampling(pass_rate=0.5))
    plan = Plan(mode="sync", rollout=(RolloutGroup(gpu_type="H20", instances=2),),
                trainer=TrainerGroup(gpu_type="H800", dp=8))
    for queue in (True, False):
        with pytest.raises(SpecError, match="ran out"):
            simulate(CLUSTER, w, plan, CM, steps=3, seed=0, record_queue=queue)


def test_the_planners_analytic_model_counts_what_dynamic_sampling_drops() -> None:
    """The MILP's engine curves are trained samples/s: generated_per_trained (2.4 at GRESO's pass rate)
    as many generated per trained; its in-flight bound holds the samples that will be dropped too."""
    from planner.candidates import candidates

    cluster = Cluster(name="c", node_groups=({"gpu_type": "H800", "nodes": 1}, {"gpu_type": "H20", "nodes": 1}))
    base = dict(model=get_model("qwen2.5-1.5b"), prompts_per_step=32, staleness=1,
                prompt_len=LengthDist(kind="fixed", value=128), response_len=LONGTAIL)
    plain = candidates(CM, cluster, Workload(**base))  # type: ignore[arg-type]
    dapo = candidates(CM, cluster, Workload(**base, dynamic_sampling=DynamicSampling(  # type: ignore[arg-type]
        pass_rate=1 / 2.4, oversample=2)))
    for a, b in zip(plain.engines, dapo.engines, strict=True):
        assert a.samples_per_s / b.samples_per_s == pytest.approx(2.4, rel=1e-9)
    for step_seconds, rate in ((0.0, 0.0), (5.0, 10.0)):  # the bound at rest and at a trainer step and rate
        assert dapo.in_flight_cap(step_seconds, rate) == pytest.approx(
            min(2 * 2 * 256, 2.4 * plain.in_flight_cap(step_seconds, rate)), rel=1e-9)


def test_simulate_reports_what_dynamic_sampling_dropped(cli, write) -> None:  # type: ignore[no-untyped-def]
    cluster = write("c.yaml", "name: c\nnode_groups:\n  - {gpu_type: H800, nodes: 1}\n  - {gpu_type: H20, nodes: 1}\n")
    workload = write("w.yaml", "model: qwen2.5-1.5b\nprompts_per_step: 8\nmode: async\nstaleness: 0.5\n"
                               "prompt_len: {kind: fixed, value: 64}\nresponse_len: {kind: fixed, value: 64}\n"
                               "dynamic_sampling: {pass_rate: 0.5}\n")
    plan = write("p.json", Plan(mode="async", staleness=0.5, rollout=(RolloutGroup(gpu_type="H20", instances=2),),
                                trainer=TrainerGroup(gpu_type="H800", dp=8)).to_json())
    res = cli("simulate", "--cluster", str(cluster), "--workload", str(workload), "--plan", str(plan), "--steps", "3",
              "--quiet")
    assert res.code == 0, res.err
    assert "dropped" in res.out and "bound 0.5 of a batch: lag at most 1" in res.out


@pytest.mark.parametrize(("eta", "chunks", "dapo"), [
    (0.25, 2, None), (1.5, 4, None), (0.5, 1, DynamicSampling(pass_rate=0.6)),
    (1, 2, DynamicSampling(pass_rate=0.7, oversample=1.5)),
])
def test_the_fast_path_and_the_reference_agree_on_the_mechanisms(eta: float, chunks: int,
                                                                 dapo: DynamicSampling | None) -> None:
    fast, _ = _run("async", eta, chunks=chunks, dapo=dapo, steps=4)
    ref, _ = _run("async", eta, chunks=chunks, dapo=dapo, steps=4, token_level=True)
    assert fast.step_times == pytest.approx(ref.step_times, rel=1e-9)
    assert fast.max_staleness <= lag_bound(eta) and fast.staleness_hist == ref.staleness_hist
    assert fast.dropped == ref.dropped


@settings(max_examples=150, deadline=None)
@given(eta=st.sampled_from([0, 0.25, 0.5, 1, 1.5, 2]), batch=st.integers(1, 12), chunks=st.sampled_from([1, 2, 3]),
       drop=st.sampled_from([0.0, 0.4]), oversample=st.sampled_from([1.0, 1.5, 2.0]), seed=st.integers(0, 10**6))
def test_the_ledger_never_deadlocks_and_bounds_the_lag(eta: float, batch: int, chunks: int, drop: float,
                                                         oversample: float, seed: int) -> None:
    """Any completion order, streaming chunks, drops and surplus: every step's chunks become ready by
    waiting for completions alone, nothing is trained twice, no trained sample lags more than ceil(eta)."""
    import itertools
    import random

    from traces.capacity import CapacityLedger

    if batch % chunks:
        chunks = 1
    rng = random.Random(seed)
    ledger: CapacityLedger[list[int]] = CapacityLedger(batch, eta, 10**6, batch // chunks if chunks > 1 else 0,
                                                       oversample=oversample)
    in_flight: list[tuple[int, int]] = []
    level_of: dict[int, int] = {}
    trained: set[int] = set()
    for step in range(6):
        for _ in range(chunks):
            while not ledger.ready(step):
                n = ledger.allowance()
                if n > 0:
                    first = ledger.admit(n)
                    in_flight += [(sid, ledger.version) for sid in range(first, first + n)]
                    level_of.update((sid, ledger.version) for sid in range(first, first + n))
                assert in_flight, "not ready, and nothing left that could complete"
                sid, level = in_flight.pop(rng.randrange(len(in_flight)))
                if rng.random() < drop or not ledger.accept(level, 1):
                    ledger.drop(level, 1)
                else:
                    ledger.buffer(level, [sid], 1)
            taken = list(itertools.chain.from_iterable(ledger.take(lambda c: sorted(itertools.chain(*c)))))
            assert len(taken) == ledger.take_size and not trained & set(taken)
            trained |= set(taken)
            assert all(step - level_of[s] <= lag_bound(eta) for s in taken)
        ledger.version = step + 1
