"""Predict every row of the calibration set (traces/data/calibration) with a cost model, as fit Cases.

Each kind is predicted the way its source measured it:
- decode: a static batch of `batch` prompts of `prompt_len` tokens, one prefill, then `output_len`
  decode iterations at growing context; output tokens/s over the whole run, or ms per output token;
- prefill: one prefill pass of `batch` prompts of `prompt_len` tokens (time to first token);
- serve: continuous batching in steady state (CostModel.generation_rate) on ShareGPT's lengths;
- train: one optimizer step of `tokens_per_step` tokens on the row's layout, as MFU (the
  Megatron / torchtitan convention: 6P + attention FLOPs over peak) or tokens/s per GPU;
- sync: one weight push to the engines of the row;
- rl_step: a simulated GRPO step (sim.simulate) of the row's setup; judged, not fitted (a
  simulation per evaluation is too slow inside a fit).
Mixture-of-experts rows (train layouts with EP, as Megatron folds it into dp x tp) are predicted
and judged but not fitted yet. Rows rlfleet cannot describe (models outside the catalog, context
parallelism, kernels that are catalog facts) are listed with the reason, never guessed.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from traces import Cluster, CostModel, Plan, Workload, get_gpu, get_model
from traces.calibration import CalibrationRow
from traces.costmodel.engine_kinds import engine_efficiency
from traces.costmodel.fit import Case
from traces.costmodel.roofline import train_flops_per_token
from traces.errors import SpecError
from traces.hardware import GpuType
from traces.models import ModelSpec

# Sources judged but not fitted, and why: rows the roofline has no term for, which a fit would meet
# by bending the efficiencies every other row shares.
# hf-asyncgrpo-lora (C82-C85): TRL's AsyncGRPOTrainer, PEFT LoRA on a 1.5B model under FSDP2, runs at
#   3.9-23.5% MFU by its own counters; one sequence per micro-batch costs 4x packed rows of the same
#   tokens (0.3 s a micro-batch), and even packed, "around 2 seconds per step ... do not look like
#   normal model math" (the post): a framework-bound trainer. Fitted, these four rows moved K5 and C24
#   from -9% to -28% held out (bench/fidelity.py --quick, 2026-12-07).
JUDGED_ONLY = {"hf-asyncgrpo-lora"}
# Sources whose trainer runs Hugging Face modules op by op (Workload.trainer_kernels 'eager',
# traces.costmodel.elementwise): TRL's AsyncGRPOTrainer. The verl runs say so in their workload.yaml.
EAGER_TRAINERS = {"hf-asyncgrpo-lora"}
# Public checkpoints that share a catalog model's architecture (their config.json fields match).
SAME_SHAPE = {"deepseek-r1-distill-qwen-1.5b": "qwen2.5-1.5b", "deepseek-r1-distill-qwen-7b": "qwen2.5-7b",
              "qwen2.5-math-1.5b": "qwen2.5-1.5b",
              "qwen3-30b-a3b-base": "qwen3-30b-a3b", "deepseek-v3.1": "deepseek-v3"}
# Per-GPU network between nodes where a row does not say (InfiniBand NDR per H100/H200/B200 GPU,
# HDR per A100: the DGX reference designs).
INTER_NODE = {"A100-80G": 25e9, "H100": 50e9, "H800": 50e9, "H200": 50e9, "B200": 100e9, "GB200": 100e9}
NODE_SIZE = {"GB200": 72}  # an NVL72 rack is one NVLink domain
GPT_FAST_NEW_TOKENS = 200  # gpt-fast's generate.py default (C9, C10 give no output length)
# Sources whose GPUs ran below the catalog's HBM rate. gpt-fast README.md (@32971d3): "Running on an
# A100 80GB, albeit power-limited to 330 watts. Empirically, seems like peak bandwidth is about 1700 GB/s."
SOURCE_HBM_TB_PER_S = {"gpt-fast": 1.7}
# Layouts the row gives only by reference (Megatron-LM README's scaling table, as tests/calibration_cases.py).
MEGATRON_175B = {"tp": 8, "pp": 12, "vp": 4}
# Decoder layers on the last pipeline rank where the source's split takes the loss into account (the
# rank holds the LM head and loss besides; traces.costmodel.pipeline). Rows not named here split the
# layers evenly, Megatron's default (C34: Megatron-Bridge's gpt-oss-120b H100 config, PP4, sets
# account_for_{embedding,loss}_in_pipeline_split false and no layout, github:NVIDIA-NeMo/Megatron-Bridge
# @a9497c6 scripts/performance/dryrun_configs/gpt_oss/gpt_oss_120b_pretrain_h100_fp8_mx_v1.yaml).
# C25, C26: Llama 3 405B takes one layer off the first and the last stage (arXiv:2407.21783 sec. 3.3.2):
#   126 layers + 2 over PP16 = 8 units a rank, the last one 7 layers + the head.
# C35: Megatron-Bridge's DeepSeek-V3 layout for PP4 VP4, [E + 4 dec] + 14 x [4 dec] + [1 dec + loss]
#   (src/megatron/bridge/recipes/deepseek/deepseek_v3.py, layout map): the last rank's chunks 3, 7, 11, 15
#   hold 4 + 4 + 4 + 1 = 13 layers.
# C58, C60, C61, C67: the ModelZoo's Qwen3-235B config sets --account-for-embedding-in-pipeline-split and
#   --account-for-loss-in-pipeline-split (github:yanring/Megatron-MoE-ModelZoo
#   model_configs/benchmarking/Qwen3-235B-A22B.yaml; runtime.conf: "96 # Account loss and embedding for
#   number of layers"): 94 + 2 units over PP8 = 12 a rank (last: 11 layers), over PP32 = 3 (last: 2).
LAST_STAGE_LAYERS = {"C25": 7, "C26": 7, "C35": 13, "C58": 11, "C60": 2, "C61": 11, "C67": 11}
SHAREGPT_PROMPT, SHAREGPT_SIGMA = 240.0, 1.0  # ShareGPT: ~240-token prompts, lognormal answers
# Rows whose figure bounds the prediction from above rather than measuring it, by their `where`:
# LMDeploy's FTL(max) of prompts sent together is the last first token, after every prompt's prefill
# and whatever decode of the early ones the engine interleaved (its FTL(min) of 0.143 s for C21 is one
# prompt's prefill), so the batch's prefill takes at most that long.
UPPER_BOUND_WHERE = ("FTL(max)",)


@dataclass(frozen=True)
class Skipped:
    id: str
    reason: str


def _model(name: str) -> ModelSpec:
    key = name.lower()
    return get_model(SAME_SHAPE.get(key, key))


def _layout(text: str) -> dict[str, int]:
    # MBS: sequences per micro-batch; MBT: tokens packed per micro-batch (TRL's token_budget)
    found = {k.lower(): int(v) for k, v in re.findall(r"\b(TP|PP|DP|CP|VP|EP|FSDP|MBS|MBT)(\d+)", text)}
    fsdp = found.pop("fsdp", None)  # "FSDP8" is 8 ranks, but "FSDP2 (DP64)" names torch's FSDP2
    if fsdp is not None and "dp" not in found:
        found["dp"] = fsdp
    return found


# Share of the dense fp8 peak a large fp8 GEMM reaches, measured: ml-engineering's Maximum Achievable
# Matmul FLOPS table, FP8 (float8_e4m3fn) (github.com/stas00/ml-engineering @744d01e,
# compute/accelerator/README.md): H100 SXM 1402.6 of 1979, H200 1453.4 of 1979, B200 3432.5 of 4500,
# B300 3353.3 of 4500, GB200 3615.6 of 5000. GPUs it does not measure keep their bf16 ceiling.
FP8_MATMUL_CEILING = {"H100": 0.709, "H800": 0.709, "H200": 0.734, "B200": 0.763, "B300": 0.745, "GB200": 0.723}


def _precision(row: CalibrationRow, model: ModelSpec, gpu: GpuType) -> tuple[ModelSpec, GpuType]:
    """fp8 rows: weights (and, as bytes_per_param sets both, the KV cache) of one byte and twice the
    dense bf16 matmul peak (Hopper, Ada and Blackwell datasheets: fp8 dense = 2x bf16 dense), at the
    measured fp8 share of it (FP8_MATMUL_CEILING) where there is one."""
    if row.precision != "fp8":
        return model, gpu
    ceiling = FP8_MATMUL_CEILING.get(gpu.name, gpu.matmul_ceiling)
    return (model.model_copy(update={"bytes_per_param": 1.0}),
            gpu.model_copy(update={"bf16_tflops": 2 * gpu.bf16_tflops, "matmul_ceiling": ceiling}))


def _source_gpu(row: CalibrationRow, gpu: GpuType) -> GpuType:
    """The row's GPU as its source ran it (SOURCE_HBM_TB_PER_S: a power limit's lower copy rate)."""
    hbm = SOURCE_HBM_TB_PER_S.get(row.source_key)
    return gpu if hbm is None else gpu.model_copy(update={"hbm_tb_per_s": hbm})


def _static_batch(cm: CostModel, row: CalibrationRow, model: ModelSpec, gpu: GpuType, tp: int
                  ) -> tuple[float, float]:
    """(prefill seconds, decode seconds) of one static batch, priced as the row's engine runs
    (engine_kinds: a scheduler-free graph loop has its own fixed decode cost)."""
    cm = replace(cm, efficiency=engine_efficiency(cm.efficiency, row.engine))
    b, p = row.batch or 1, row.prompt_len or 1
    o = row.output_len or GPT_FAST_NEW_TOKENS
    prefill = float(cm.prefill(gpu, model, tp, b * p, p).seconds)
    decode = float(cm.decode(gpu, model, tp, b, p + np.arange(o)).seconds.sum())
    return prefill, decode


def _decode(row: CalibrationRow, model: ModelSpec, gpu: GpuType, tp: int) -> Callable[[CostModel], float]:
    o = row.output_len or GPT_FAST_NEW_TOKENS
    if row.unit == "ms_per_token":
        return lambda cm: 1000 * _static_batch(cm, row, model, gpu, tp)[1] / o
    return lambda cm: (row.batch or 1) * o / sum(_static_batch(cm, row, model, gpu, tp))


def _prefill(row: CalibrationRow, model: ModelSpec, gpu: GpuType, tp: int) -> Callable[[CostModel], float]:
    b, p = row.batch or 1, row.prompt_len or 1
    return lambda cm: 1000 * float(cm.prefill(gpu, model, tp, b * p, p).seconds)


def _serve(row: CalibrationRow, model: ModelSpec, gpu: GpuType, tp: int) -> Callable[[CostModel], float]:
    mean_out = 4132.37 / 21.27  # K1: output tok/s over requests/s, the mean response (194 tokens)
    return lambda cm: float(cm.generation_rate(
        gpu, model, tp, prompt_mean=SHAREGPT_PROMPT, response_mean=mean_out,
        response_sq_mean=mean_out**2 * math.exp(SHAREGPT_SIGMA**2)).tokens_per_s)


def _train(row: CalibrationRow, model: ModelSpec, gpu: GpuType) -> Callable[[CostModel], float] | str:
    lay = _layout(row.layout)
    if lay.get("cp", 1) > 1:
        return "context parallelism is not modelled"
    if "TP/PP/DP" in row.layout:
        lay = {**MEGATRON_175B, "dp": row.gpus // (MEGATRON_175B["tp"] * MEGATRON_175B["pp"])}
    tp, pp, vp = lay.get("tp", 1), lay.get("pp", 1), lay.get("vp", 1)
    dp = lay.get("dp", row.gpus // (tp * pp))
    if dp * tp * pp != row.gpus:
        return f"layout {row.layout!r} does not multiply to {row.gpus} GPUs"
    if row.seq_len is None or row.tokens_per_step is None:
        return "no sequence length or tokens per step"
    peak = get_gpu(row.gpu_type).bf16_flops  # MFU is quoted against the bf16 peak
    seq, tokens = row.seq_len, row.tokens_per_step
    zero = 3 if "FSDP" in row.layout else 1
    mbs = lay.pop("mbs", 1)  # sequences per micro-batch where the source gives it (Megatron-Bridge's MBS)
    recompute = "full" if "full recompute" in row.layout else "none" if "no recompute" in row.layout else "selective"
    lora = re.search(r"\bLoRA r(\d+)", row.layout)  # a rank-r adapter trains, the base is frozen (traces.lora)
    lora_rank = int(lora.group(1)) if lora else 0
    forward = "forward only" in row.layout  # the step's forward pass timed alone (TRL's perf/fwd_s)
    kw = {"seq_len": seq, "microbatch_tokens": lay.pop("mbt", seq * mbs), "zero_stage": zero, "recompute": recompute,
          "kernels": "eager" if row.source_key in EAGER_TRAINERS else "fused",
          "virtual_stages": vp, "gpus_per_node": NODE_SIZE.get(gpu.name, 8),
          "inter_node_bytes_per_s": INTER_NODE.get(gpu.name, 50e9), "last_stage_layers": LAST_STAGE_LAYERS.get(row.id)}

    ep = lay.get("ep", 1)  # Megatron folds EP into the dp x tp ranks (expert tensor parallelism 1)
    if (dp * tp) % ep:
        return f"EP {ep} does not divide the {dp * tp} dp x tp ranks"

    # A step captured in CUDA graphs (C67: Megatron-Core with HybridEP, whose dispatch needs no host
    # wait) replays its launches: no fixed cost per MoE layer (Efficiency.moe_layer_overhead_s).
    graphs = "CUDA graphs" in row.engine

    forward_kw = {k: v for k, v in kw.items() if k not in ("recompute", "virtual_stages")}

    def seconds(cm: CostModel) -> float:
        if graphs:
            cm = replace(cm, efficiency=replace(cm.efficiency, moe_layer_overhead_s=0.0))
        if forward:
            return float(cm.logprob(gpu, model, dp, tp, pp, tokens, ep=ep, lora_rank=lora_rank, **forward_kw).seconds)
        return float(cm.train(gpu, model, dp, tp, pp, tokens, ep=ep, lora_rank=lora_rank, **kw).seconds)

    if row.unit == "mfu":
        flops = float(train_flops_per_token(model, seq)) * tokens
        return lambda cm: flops / (seconds(cm) * row.gpus * peak)
    if row.unit == "step_s":  # the step's (or pass's) seconds, as the source's timer gives them
        return seconds
    return lambda cm: tokens / (seconds(cm) * row.gpus)


def _sync(row: CalibrationRow, model: ModelSpec, gpu: GpuType) -> Callable[[CostModel], float]:
    # K7: one TP8 engine on the trainer's node (NVLink)
    return lambda cm: float(cm.sync(gpu, model, 1, gpu.link_bytes_per_s).seconds)


def k6_step(cm: CostModel, sigma: float = 0.7, steps: int = 6) -> float:
    """K6 simulated: NeMo-RL 0.5, llama-3.1-8b GRPO on 16 H100, colocated; mean step seconds.

    As the row gives it: 64 prompts x 32 generations, global batch 512 (4 PPO minibatches of the
    2048 samples), max sequence 4096, mean generated length 1019. Assumptions (not in the row):
    prompts of 127 tokens (the row's 1581 tok/s/GPU x 16 x 92.8 s minus the generated tokens, over
    2048 samples); responses lognormal with `sigma` capped at 4096 - 127; 2 nodes of 8 GPUs; 16 vLLM
    TP1 engines; a Megatron trainer dp16 with the distributed optimizer (ZeRO-1), no recomputation;
    NeMo-RL's default KL penalty to a reference policy (one more logprob pass).
    """
    from sim.simulate import simulate
    from traces import Cluster, Plan, RolloutGroup, TrainerGroup, Workload

    cluster = Cluster(name="h100-16", node_groups=({"gpu_type": "H100", "nodes": 2, "gpus_per_node": 8},))
    w = Workload(name="k6", model=get_model("llama-3.1-8b"), prompts_per_step=64, group_size=32,
                 prompt_len={"kind": "fixed", "value": 127},
                 response_len={"kind": "lognormal", "mean": 1019, "sigma": sigma, "cap": 4096 - 127},
                 mode="colocated", ppo_minibatches=2048 // 512, kl_reference=True)
    plan = Plan(mode="colocated", rollout=(RolloutGroup(gpu_type="H100", tp=1, instances=16),),
                trainer=TrainerGroup(gpu_type="H100", dp=16, zero_stage=1, recompute="none"))
    return simulate(cluster, w, plan, cm, steps=steps, seed=0).mean_step_s


# Runs written down in full (cluster, workload, plan) under traces/data/runs/, by their rows' `run`.
RUN_DIRS = {"verl-7412-qwen3-4b": "verl-qwen3-4b-4x4090",
            "relax-task22-qwen3-0.6b": "relax-qwen3-0.6b-2xrtxpro6000",
            "verl-retool-qwen2.5-32b": "verl-retool-qwen2.5-32b-8xh200"}
# A row's unit -> the phases of sim.breakdown it sums (verl's timing_s/gen is the trainer's wait in sync modes).
PHASE_OF_UNIT = {"gen_s": ("wait",), "logprob_s": ("logprob",), "train_s": ("train",), "sync_s": ("sync",),
                 "step_s": ("step",)}
# Runs whose framework counts a phase elsewhere. Relax's Hybrid async (slime's metrics: perf/step_time =
# train_wait + train_time) publishes the weights inside the trainer's wait: the end-to-end interval between
# actor completions (3.636 s) equals perf/step_time (3.652 s) while a publication takes 0.650 s, so the
# logged train_wait is rlfleet's wait plus its sync (benchmarks/results/task22-hybrid-async-text @d8743b9).
# The ReTool run's verl (github:bojieli/verl @124e60a) wakes the engines inside its gen timer: the agent loop's
# generate_sequences calls wake_up, whose rollout_mode loads the offloaded FSDP weights and pushes them into
# vLLM, and puts the engines back to sleep before the timer ends (verl/experimental/agent_loop/agent_loop.py,
# verl/workers/fsdp_workers.py there), so its timing_s/gen holds the hand-overs and the weight push.
# verl issue 7412's verl (its log has timing_s/update_weights, the CheckpointEngineManager's timer, and
# timing_s/agent_loop/*) puts engine sleep and engine wake-up in different timers: `gen` runs the agent
# loop's generate_sequences, then checkpoint_manager.sleep_replicas (the hand-over to the trainer);
# `update_weights` resumes the engine's weights, pushes the trainer's, and resumes its KV cache (the
# hand-over back, then the push) (verl/trainer/ppo/ray_trainer.py and verl/workers/engine_workers.py
# update_weights, github:verl-project/verl @bf48903d9, the day). The simulator prices the two
# hand-overs alike (two `switch` rows a step, CostModel.colocate_switch each), so each timer gets half
# ((phase, share) entries take that share of a phase).
RUN_PHASE_OF_UNIT: dict[str, dict[str, tuple[str | tuple[str, float], ...]]] = {
    "relax-task22-qwen3-0.6b": {"gen_s": ("wait", "sync")},
    "verl-retool-qwen2.5-32b": {"gen_s": ("wait", "switch", "sync")},
    "verl-7412-qwen3-4b": {"gen_s": ("wait", ("switch", 0.5)), "sync_s": (("switch", 0.5), "sync")}}
_RUN_STEPS = 4
# Runs simulated for longer: an async run's steps come in periods of staleness + 1 (traces.records.
# recommended_steps), and 4 steps hold less than one steady period at staleness 2.
RUN_STEPS = {"relax-task22-qwen3-0.6b": 48}
# vLLM's share of HBM (gpu_memory_utilization) as each run's framework sets it by default; it is an
# engine setting, not a plan field, so the run is priced with it in place of the cost model's 0.9.
# verl: `actor_rollout_ref.rollout.gpu_memory_utilization: 0.5` (github.com/verl-project/verl
# @005f273, verl/trainer/config/rollout/rollout.yaml).
# The ReTool run's script sets actor_rollout_ref.rollout.gpu_memory_utilization=0.9 (github:bojieli/verl
# recipe/retool/run_qwen2-32b_dapo.sh @124e60a).
RUN_ENGINE_SHARE = {"verl-7412-qwen3-4b": 0.5, "verl-retool-qwen2.5-32b": 0.9}


def load_run(run: str) -> tuple[Cluster, Workload, Plan]:
    """The cluster, workload and plan a written-down run's folder holds (traces/data/runs)."""
    from importlib import resources

    from traces import load_cluster, load_plan, load_workload

    d = resources.files("traces").joinpath("data", "runs", RUN_DIRS[run])
    return (load_cluster(str(d / "cluster.yaml")), load_workload(str(d / "workload.yaml")),
            load_plan(str(d / "plan.json")))


def run_phases(run: str, cm: CostModel, kernels: str | None = None) -> dict[str, float]:
    """Mean simulated phases (sim.breakdown.mean_phases) of a written-down run, memoised per cost model;
    `kernels` prices its trainer with other kernels than its workload says (Workload.trainer_kernels)."""
    key = (run, id(cm.tables), cm.efficiency, kernels)
    if key not in _PHASES:
        from sim.breakdown import mean_phases
        from sim.simulate import simulate

        cluster, workload, plan = load_run(run)
        if kernels is not None:
            workload = workload.model_copy(update={"trainer_kernels": kernels})
        share = RUN_ENGINE_SHARE.get(run, cm.efficiency.engine_memory_fraction)
        run_cm = replace(cm, efficiency=replace(cm.efficiency, engine_memory_fraction=share))
        r = simulate(cluster, workload, plan, run_cm, steps=RUN_STEPS.get(run, _RUN_STEPS), seed=0)
        _PHASES[key] = mean_phases(r.timeline, plan.staleness)
    return _PHASES[key]


_PHASES: dict[tuple[str, int, object, str | None], dict[str, float]] = {}


def _rl_step(row: CalibrationRow) -> Callable[[CostModel], float] | str:
    if row.id == "K6":
        return k6_step
    if row.run in RUN_DIRS and row.unit in PHASE_OF_UNIT:
        run = row.run
        shares = [(p, 1.0) if isinstance(p, str) else p
                  for p in RUN_PHASE_OF_UNIT.get(run, {}).get(row.unit, PHASE_OF_UNIT[row.unit])]
        return lambda cm: sum(share * run_phases(run, cm)[p] for p, share in shares)
    return "the setup's generation/trainer split and response lengths are not published"


def case(row: CalibrationRow) -> Case | Skipped:
    """The row as a fit Case (its prediction in the row's unit), or why it cannot be predicted."""
    if row.kind == "kernel":
        return Skipped(row.id, "a catalog fact (the GPU's matmul ceiling or copy rate), not a cost-model output")
    if row.kind == "rl_step" and row.run in RUN_DIRS:  # the run's own cluster file declares its GPUs
        return _judged(row, _rl_step(row))
    try:
        model = _model(row.model)
    except SpecError:
        return Skipped(row.id, f"{row.model} is not in the catalog")
    try:
        model, gpu = _precision(row, model, _source_gpu(row, get_gpu(row.gpu_type)))
    except SpecError:
        return Skipped(row.id, f"{row.gpu_type} is not in the catalog")
    tp = _layout(row.layout).get("tp", 1)
    predict: Callable[[CostModel], float] | str
    if row.kind == "decode":
        predict = _decode(row, model, gpu, tp)
    elif row.kind == "prefill":
        predict = _prefill(row, model, gpu, tp)
    elif row.kind == "serve":
        predict = _serve(row, model, gpu, tp)
    elif row.kind == "train":
        predict = "fp8 training is not modelled (training is priced in bf16)" if row.precision == "fp8" else \
            _train(row, model, gpu)
    elif row.kind == "sync":
        # the predictor rebuilds K7's path (trainer and one engine on one node); the checkpoint-engine
        # rows (host-memory broadcast, receivers across the network) take paths it does not model
        predict = _sync(row, model, gpu) if row.id == "K7" else \
            "the weight path (host-memory broadcast or many receivers over the network) is not modelled"
    else:
        predict = _rl_step(row)
    return _judged(row, predict)


def _judged(row: CalibrationRow, predict: Callable[[CostModel], float] | str) -> Case | Skipped:
    if isinstance(predict, str):
        return Skipped(row.id, predict)
    bound = "upper" if any(w in row.where for w in UPPER_BOUND_WHERE) else ""
    fitted = row.kind != "rl_step" and row.source_key not in JUDGED_ONLY
    return Case(row.id, row.source_key, row.kind, row.value, predict, fitted=fitted, bound=bound)
