"""An eager trainer's traffic between GEMMs (Workload.trainer_kernels, traces/costmodel/elementwise.py): counted
from the op sequence of Hugging Face's decoder layer, weighing most on small models, moving the published
eager-trainer phases towards what was logged and not past it, priced by the planner as by the simulator, and
validated as a workload field."""

from __future__ import annotations

import pytest

from sim.calibration_set import PHASE_OF_UNIT, RUN_DIRS, case, load_run, run_phases
from traces import CostModel, SpecError, Workload, get_gpu, get_model
from traces.calibration import load_calibration
from traces.costmodel.elementwise import BACKWARD_PER_FORWARD, forward_bytes_per_token, pass_bytes_per_token
from traces.io import validate

CM = CostModel.roofline_only()
KW = {"seq_len": 1500, "microbatch_tokens": 16384}


def test_the_count_is_the_decoder_layers_ops_and_the_loss_head() -> None:
    """Qwen2.5-1.5B (hidden 1536, q 1536, kv 256, FFN 8960, 28 layers, vocab 151936): per layer two
    RMSNorms (32 h each), rotary on q and k (22 bytes a value), the gated MLP's activation and product
    (10 ff), two residual adds (12 h); plus three fp32 passes over the logits."""
    m = get_model("qwen2.5-1.5b")
    per_layer = 64 * 1536 + 22 * (1536 + 256) + 10 * 8960 + 12 * 1536
    assert forward_bytes_per_token(m) == 28 * per_layer + 3 * 4 * 151936
    train = pass_bytes_per_token(m, "eager", forward_only=False, recompute="none")
    assert train == pytest.approx((1 + BACKWARD_PER_FORWARD) * forward_bytes_per_token(m))
    assert pass_bytes_per_token(m, "fused", forward_only=False, recompute="full") == 0.0
    assert forward_bytes_per_token(m, lora_rank=1) > 1.5 * forward_bytes_per_token(m)  # LoRA's own path


def test_an_moe_models_dense_layers_are_counted_at_the_dense_width() -> None:
    """Qwen3-30B-A3B with its first 4 layers made dense (intermediate 6144; a routed layer's token passes
    8 experts of 768, 6144 too): the activations do not change, but a LoRA adapter on those layers adapts
    one dense gate/up/down (2 x 2048 -> 6144, 6144 -> 2048) where a routed layer adapts the router and
    8 experts' (2 x 2048 -> 768, 768 -> 2048): 2 d_in + 12 d_out each."""
    m = get_model("qwen3-30b-a3b")
    assert m.moe is not None
    dense4 = m.model_copy(update={"moe": m.moe.model_copy(update={"dense_layers": 4})})
    h, ff, ffe, k, experts = m.hidden, m.intermediate, m.moe.expert_intermediate, 8, m.moe.experts
    assert forward_bytes_per_token(dense4) == forward_bytes_per_token(m)
    dense_mlp = 2 * (2 * h + 12 * ff) + (2 * ff + 12 * h)
    routed_mlp = (2 * h + 12 * experts) + k * (2 * (2 * h + 12 * ffe) + (2 * ffe + 12 * h))
    lora = forward_bytes_per_token(dense4, lora_rank=1) - forward_bytes_per_token(m, lora_rank=1)
    assert lora == pytest.approx(4 * (dense_mlp - routed_mlp))


def test_eager_kernels_weigh_most_on_small_models() -> None:
    """The GEMMs grow as hidden^2 and this traffic as hidden: on an H200 an eager forward of 1.5B is
    slowed more than one of 8B, and that more than one of 32B; fused kernels add nothing."""
    h200 = get_gpu("H200")
    ratios = []
    for name in ("qwen2.5-1.5b", "llama-3.1-8b", "qwen2.5-32b"):
        m = get_model(name)
        fused = float(CM.logprob(h200, m, 1, 1, 1, 100_000, **KW).seconds)
        eager = float(CM.logprob(h200, m, 1, 1, 1, 100_000, kernels="eager", **KW).seconds)
        ratios.append(eager / fused)
    assert ratios[0] > ratios[1] > ratios[2] > 1.05


@pytest.mark.parametrize("row_id", ["C54", "C55", "C79", "C80", "C83", "C84", "C85"])
def test_eager_kernels_move_published_eager_trainer_phases_towards_the_log(row_id: str) -> None:
    """verl's FSDP workers (C54/C55: RTX 4090, C79/C80: H200) and TRL (C83-C85) run Hugging Face modules:
    with their traffic counted the predicted phase comes closer to what was logged, and no phase becomes
    slower than logged (the count adds bytes the trainer does stream, not a fitted factor)."""
    import sim.calibration_set as cs

    row = next(r for r in load_calibration() if r.id == row_id)
    eager = case(row)
    saved = cs.EAGER_TRAINERS
    try:
        cs.EAGER_TRAINERS = set()
        fused = case(row) if row.kind == "train" else None
    finally:
        cs.EAGER_TRAINERS = saved
    shipped = CostModel()
    with_count = eager.predict(shipped)  # type: ignore[union-attr]
    # a run's workload says trainer_kernels: eager; it is priced fused again
    without = fused.predict(shipped) if fused is not None else _fused_run_phase(row, shipped)  # type: ignore[union-attr]
    assert without < with_count <= row.value


def _fused_run_phase(row, cm: CostModel) -> float:  # type: ignore[no-untyped-def]
    assert row.run in RUN_DIRS and load_run(row.run)[1].trainer_kernels == "eager"  # the run's own
    return sum(run_phases(row.run, cm, "fused")[p] for p in PHASE_OF_UNIT[row.unit])


def test_the_planner_prices_an_eager_trainer_as_the_simulator_does() -> None:
    """The MILP's trainer options read the workload's kernels (traces.costmodel.rl), so an eager trainer's
    analytic step is the simulated one's: slower than fused, by the same cost-model call."""
    from planner.candidates import candidates
    from traces import Cluster
    from traces.lengths import LengthDist

    cluster = Cluster(name="c", node_groups=({"gpu_type": "H100", "nodes": 2},))
    w = Workload(model=get_model("qwen2.5-1.5b"), prompts_per_step=64, group_size=8,
                 prompt_len=LengthDist(kind="fixed", value=256), response_len=LengthDist(kind="fixed", value=1024))
    best = {}
    for kernels in ("fused", "eager"):
        cand = candidates(CM, cluster, w.model_copy(update={"trainer_kernels": kernels}))
        best[kernels] = min(t.step_seconds - cand.sync_seconds for t in cand.trainers)
    assert best["eager"] > 1.05 * best["fused"]


def test_a_bad_kernels_value_names_the_field() -> None:
    raw = {"model": "qwen2.5-1.5b", "prompts_per_step": 8, "prompt_len": {"kind": "fixed", "value": 128},
           "response_len": {"kind": "fixed", "value": 512}, "trainer_kernels": "compiled"}
    with pytest.raises(SpecError, match="trainer_kernels") as err:
        validate(Workload, raw, "workload")
    assert "\n" not in str(err.value)


def test_costs_train_prices_eager_kernels(cli) -> None:  # type: ignore[no-untyped-def]
    import json

    args = ("costs", "train", "--gpu", "H200", "--model", "qwen2.5-1.5b", "--tokens", "1000000", "--json")
    fused, eager = (json.loads(cli(*args, *extra).out) for extra in ((), ("--kernels", "eager")))
    assert eager["kernels"] == "eager" and eager["seconds"] > 1.2 * fused["seconds"]
    bad = cli(*args, "--kernels", "compiled")
    assert bad.code == 2 and "--kernels" in bad.err
