"""LoRA jobs (Workload.lora_rank) and the trainer's micro-batch budget (Workload.train_microbatch_tokens):
each a field, validated, moving the trainer's cost the way traces.lora and its sources say, exported
to AReaL and verl in their own config fields, and refused by the runtime in one line."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sim import simulate
from sim.breakdown import mean_phases
from traces import Cluster, CostModel, Plan, RolloutGroup, SpecError, TrainerGroup, Workload, get_gpu, get_model
from traces.costmodel import COLUMNS, ProfileTable
from traces.costmodel.efficiency import DEFAULT_EFFICIENCY
from traces.costmodel.rl import trainer_fits, trainer_step_seconds
from traces.costmodel.roofline import train_state_bytes
from traces.io import validate
from traces.lengths import LengthDist
from traces.lora import adapter_params, adapter_tensors, table_name

CM = CostModel.roofline_only()
H100, H20 = get_gpu("H100"), get_gpu("H20")
QWEN7 = get_model("qwen2.5-7b")
CLUSTER = Cluster(name="c", node_groups=({"gpu_type": "H800", "nodes": 1}, {"gpu_type": "H20", "nodes": 1}))


def _workload(**fields: object) -> Workload:
    return Workload(model=get_model("qwen2.5-1.5b"), prompts_per_step=32, group_size=8, mode="sync",
                    ppo_minibatches=2, prompt_len=LengthDist(kind="fixed", value=128),
                    response_len=LengthDist(kind="lognormal", mean=600, sigma=0.8, cap=2048), **fields)  # type: ignore[arg-type]


def test_adapter_size_is_rank_times_the_adapted_widths() -> None:
    """Qwen2.5-1.5B (hidden 1536, 12 heads of 128, 2 KV heads, FFN 8960, 28 layers): per layer
    q, k, v, o and gate, up, down give sum(d_in + d_out) = 3072 + 2 x 1792 + 3072 + 2 x 10496 + 10496
    = 41216; rank 1 over 28 layers is 1,154,048 parameters, 14 tensors a layer."""
    m = get_model("qwen2.5-1.5b")
    assert adapter_params(m, 1) == 28 * 41216
    assert adapter_params(m, 16) == 16 * adapter_params(m, 1)
    assert adapter_tensors(m) == 28 * 14
    moe = get_model("qwen3-30b-a3b")  # every routed expert is adapted: the adapter grows with the experts
    assert adapter_params(moe, 1) > 100 * moe.layers * (4 * moe.hidden)


def test_a_frozen_base_drops_the_weight_gradient_pass() -> None:
    """Hugging Face's AsyncGRPO LoRA blog (github:huggingface/blog asyncgrpo-lora-hfjobs.md @081e91b):
    "A normal backward costs roughly twice the forward, and with frozen base weights it should be closer
    to once". On one GPU (no data-parallel traffic) at a compute-bound size, a LoRA step is about
    (1 + 1) / (1 + 2) of a full one; with full recomputation (one forward more) (1 + 1 + 1) / (1 + 1 + 2)."""
    kw = {"seq_len": 2048, "microbatch_tokens": 8192}
    for recompute, ratio in (("none", 2 / 3), ("full", 3 / 4)):
        full = float(CM.train(H100, QWEN7, 1, 1, 1, 1_000_000, recompute=recompute, **kw).seconds)
        lora = float(CM.train(H100, QWEN7, 1, 1, 1, 1_000_000, recompute=recompute, lora_rank=16, **kw).seconds)
        assert lora / full == pytest.approx(ratio, rel=0.04)


def test_a_frozen_base_holds_its_weights_alone() -> None:
    """Mixed-precision Adam keeps 16 bytes a parameter (ZeRO paper); a frozen bf16 base keeps 2, and only
    the adapter carries gradients and optimizer states: a 7B LoRA trainer fits one H20 (96 GB), a full one
    does not."""
    full = float(train_state_bytes(QWEN7, 1, 1, 1, zero_stage=0))
    lora = float(train_state_bytes(QWEN7, 1, 1, 1, zero_stage=0, lora_rank=16))
    assert lora / full == pytest.approx((2 * QWEN7.params + 16 * adapter_params(QWEN7, 16)) / (16 * QWEN7.params))
    w = Workload(model=QWEN7, prompts_per_step=8, prompt_len=LengthDist(kind="fixed", value=256),
                 response_len=LengthDist(kind="fixed", value=1024))
    fits = [bool(trainer_fits(CM, H20, w.model_copy(update={"lora_rank": r}), 1, 1, 1, zero_stage=0,
                              recompute="full")) for r in (0, 16)]
    assert fits == [False, True]


def test_a_lora_job_syncs_the_adapter_and_trains_faster_in_simulation() -> None:
    """The engines load the adapter (vLLM's /v1/load_lora_adapter): the push is the adapter's bytes and
    tensors, not the model's; the simulated train phase shrinks as the cost model says, the logprob
    pass (a forward of the same base plus the adapter's small GEMMs) barely grows."""
    plan = Plan(mode="sync", trainer=TrainerGroup(gpu_type="H800", dp=8),
                rollout=(RolloutGroup(gpu_type="H20", instances=8, tp=1),))
    phases = {}
    for r in (0, 8):
        res = simulate(CLUSTER, _workload(lora_rank=r), plan, CM, steps=3, seed=0)
        phases[r] = mean_phases(res.timeline, 0)
    assert phases[8]["sync"] < phases[0]["sync"]  # 1.5B: latencies per tensor are most of either push
    full, lora = (float(CM.sync(H100, QWEN7, 4, 12.5e9, r).seconds) for r in (0, 16))
    assert lora < 0.25 * full  # 7B over a 100 Gb/s path: the model's 15 GB are most of a full push
    assert phases[8]["train"] < 0.8 * phases[0]["train"]
    assert phases[0]["logprob"] < phases[8]["logprob"] < 1.02 * phases[0]["logprob"]  # rank 8: 9.2M of 1.5B
    assert phases[8]["step"] < phases[0]["step"]


def test_measured_lora_rows_price_lora_steps_only() -> None:
    """A cost table's LoRA step is filed as '<model>+lora<r>' (traces.lora.table_name): it prices that
    job's step, and a full fine-tuning row of the same model never prices a LoRA step."""
    m = get_model("qwen2.5-1.5b")
    row = {"gpu_type": "H100", "stage": "train", "tp": 1, "pp": 1, "dp": 1, "batch": 1, "context": 0,
           "tokens": 100_000, "seconds": 123.0, "source": "test"}
    frame = pd.DataFrame([{**row, "model": table_name(m, 4)}], columns=list(COLUMNS))
    cm = CostModel(ProfileTable(frame), DEFAULT_EFFICIENCY)
    kw = {"seq_len": 1024, "microbatch_tokens": 4096}
    assert float(cm.train(H100, m, 1, 1, 1, 100_000, lora_rank=4, **kw).seconds) == pytest.approx(123.0)
    assert float(cm.train(H100, m, 1, 1, 1, 100_000, **kw).seconds) < 10  # the roofline, not the LoRA row
    full = CostModel(ProfileTable(frame.assign(model=m.name)), DEFAULT_EFFICIENCY)
    assert float(full.train(H100, m, 1, 1, 1, 100_000, lora_rank=4, **kw).seconds) < 10


def test_the_policys_logprob_pass_runs_the_adapter_and_the_references_does_not() -> None:
    """The old policy's forward is the adapted model's: the adapter's GEMMs (+2 P_a FLOPs a token) and, in an
    eager trainer, PEFT's LoRA path between them; the KL reference is the base alone. So a LoRA job's step
    prices one adapted pass and one base pass, and a cost table's LoRA logprob rows price only the first."""
    m = get_model("qwen2.5-1.5b")
    kw = {"seq_len": 1024, "microbatch_tokens": 16384, "kernels": "eager"}
    base = float(CM.logprob(H100, m, 1, 1, 1, 1e6, **kw).seconds)
    adapted = float(CM.logprob(H100, m, 1, 1, 1, 1e6, lora_rank=8, **kw).seconds)
    assert adapted > 1.05 * base  # the LoRA path's traffic: more than 1.5x the layer's own (elementwise tests)
    fused = {**kw, "kernels": "fused"}
    lora_flops = float(CM.logprob(H100, m, 1, 1, 1, 1e6, lora_rank=8, **fused).seconds)
    assert base > float(CM.logprob(H100, m, 1, 1, 1, 1e6, **fused).seconds) and lora_flops > \
        float(CM.logprob(H100, m, 1, 1, 1, 1e6, **fused).seconds)
    w = _workload(lora_rank=8, kl_reference=True, trainer_kernels="eager")
    logprob, _ = trainer_step_seconds(CM, H100, w, 1, 1, 1, 1e6, zero_stage=3, recompute="none", gpus_per_node=8,
                                      inter_node_bytes_per_s=50e9)
    wkw = {"seq_len": w.mean_tokens_per_sample, "microbatch_tokens": w.microbatch_tokens, "kernels": "eager"}
    one_each = CM.logprob(H100, m, 1, 1, 1, 1e6, lora_rank=8, **wkw).seconds + CM.logprob(H100, m, 1, 1, 1, 1e6,
                                                                                           **wkw).seconds
    assert float(logprob) == pytest.approx(float(one_each), rel=1e-12)


def test_a_lora_runs_profile_files_its_policy_and_reference_logprobs_apart() -> None:
    """`rlfleet calibrate` on a LoRA run writes its train, sync and policy-logprob rows under '<model>+lora<r>'
    and the reference pass's under the base model (sim.calibrate.profile_rows)."""
    from sim.calibrate import Calibration, profile_rows

    w = _workload(lora_rank=4)
    plan = Plan(mode="sync", rollout=(RolloutGroup(gpu_type="H20", tp=1, instances=8),),
                trainer=TrainerGroup(gpu_type="H800", dp=8))
    cal = Calibration(DEFAULT_EFFICIENCY, {}, {}, {}, ())
    rows = profile_rows(cal, CLUSTER, w, plan, "test")
    lora = table_name(w.model, 4)
    assert set(rows[rows.model == lora].stage) == {"train", "logprob", "sync"}
    assert set(rows[rows.model == w.model.name].stage) == {"decode", "prefill", "logprob"}
    policy = rows[(rows.model == lora) & (rows.stage == "logprob")].seconds.to_numpy()
    reference = rows[(rows.model == w.model.name) & (rows.stage == "logprob")].seconds.to_numpy()
    # the smallest passes sit at the latency floor; the rest carry the adapter's GEMMs
    assert len(policy) == len(reference) and (policy >= reference).all() and policy[-1] > reference[-1]


def test_the_microbatch_budget_sets_how_many_micro_batches_a_step_takes() -> None:
    """With a fill loss for small micro-batches (Efficiency.train_half_tokens) or a fixed cost per
    micro-batch (moe_layer_overhead_s), packing more tokens into each micro-batch (verl's
    ppo_max_token_len_per_gpu, TRL's token_budget) shortens the step; None keeps one longest sequence."""
    base = _workload()
    assert base.microbatch_tokens == base.max_seq_len
    packed = base.model_copy(update={"train_microbatch_tokens": 8 * base.max_seq_len})
    assert packed.microbatch_tokens == 8 * base.max_seq_len
    cm = CostModel.roofline_only(replace(DEFAULT_EFFICIENCY, train_half_tokens=4096))
    steps = [float(np.sum(trainer_step_seconds(cm, H100, w, 8, 1, 1, 1_000_000, zero_stage=1, recompute="none",
                                               gpus_per_node=8, inter_node_bytes_per_s=50e9)))
             for w in (base, packed)]
    assert steps[1] < 0.8 * steps[0]


@pytest.mark.parametrize(("fields", "named"), [
    ({"lora_rank": -1}, "lora_rank"),
    ({"lora_rank": 4096}, "lora_rank"),  # not below qwen2.5-1.5b's hidden size (1536)
    ({"lora_rank": 8, "model": "deepseek-v3"}, "lora_rank"),
    ({"train_microbatch_tokens": 100}, "train_microbatch_tokens"),
    ({"train_microbatch_tokens": 0}, "train_microbatch_tokens"),
])
def test_bad_lora_and_microbatch_fields_name_the_field(fields: dict[str, object], named: str) -> None:
    raw = {"model": "qwen2.5-1.5b", "prompts_per_step": 8, "prompt_len": {"kind": "fixed", "value": 128},
           "response_len": {"kind": "fixed", "value": 512}, **fields}
    with pytest.raises(SpecError, match=named) as err:
        validate(Workload, raw, "workload")
    assert "\n" not in str(err.value)


def test_the_runtime_refuses_a_lora_job_in_one_line() -> None:
    """rlfleet run trains every weight: a LoRA workload is refused (planned, simulated, exported only)."""
    from runtime.run_plan import run_shape

    plan = Plan(mode="sync", trainer=TrainerGroup(gpu_type="H800", dp=1, nodes=(0,)),
                rollout=(RolloutGroup(gpu_type="H20", instances=1, tp=1, nodes=(1,)),))
    with pytest.raises(SpecError, match="lora_rank 8") as err:
        run_shape(plan, _workload(lora_rank=8), CLUSTER, lambda g, i: None, "torch", toy=False)
    assert "\n" not in str(err.value)


def test_costs_prices_a_lora_step_and_refuses_a_bad_rank_in_one_line(cli) -> None:  # type: ignore[no-untyped-def]
    import json

    args = ("costs", "train", "--gpu", "H100", "--model", "qwen2.5-7b", "--tokens", "1000000", "--json")
    full, lora = (json.loads(cli(*args, *extra).out) for extra in ((), ("--lora-rank", "16")))
    assert lora["lora_rank"] == 16 and lora["seconds"] < full["seconds"]
    assert lora["memory_bytes_per_gpu"] < 0.5 * full["memory_bytes_per_gpu"]
    sync = json.loads(cli("costs", "sync", "--from", "H100", "--to", "H100", "--model", "qwen2.5-7b",
                          "--lora-rank", "16", "--json").out)
    assert sync["bytes"] < 0.01 * get_model("qwen2.5-7b").weight_bytes
    for bad, named in (("-3", "--lora-rank -3"), ("8192", "--lora-rank 8192")):
        res = cli(*args, "--lora-rank", bad)
        assert res.code == 2 and named in res.err and res.err.count("\n") == 1


def test_plan_names_a_lora_trainer_and_plans_it_cheaper(cli, write) -> None:  # type: ignore[no-untyped-def]
    """The planner prices the LoRA trainer (traces.costmodel.rl reads the workload): the trainer line says
    so, and the MILP's rate for the same job is at least full fine-tuning's (its trainer is only faster)."""
    text = Path("traces/data/workloads/qwen2.5-1.5b-math-short.yaml").read_text(encoding="utf-8")
    lora = write("lora.yaml", text + "\nlora_rank: 8\n")
    base = ["plan", "--cluster", "traces/data/clusters/h800-h20-l40s-4node.yaml", "--no-baselines",
            "--no-settle", "--no-marginal", "--sim-steps", "4"]
    res = cli(*base, "--workload", str(lora))
    assert res.code == 0, res.err
    assert "LoRA rank 8" in next(line for line in res.out.splitlines() if line.strip().startswith("trainer"))
    full = cli(*base, "--workload", "traces/data/workloads/qwen2.5-1.5b-math-short.yaml", "--json").json()
    mine = cli(*base, "--workload", str(lora), "--json").json()
    assert mine["analytic_samples_per_s"] >= full["analytic_samples_per_s"] * (1 - 1e-9)
