"""The toy task: a tiny Llama learns digit addition with async GRPO, in one process or on Ray, on CPU.

Its set-up (runtime.task_factory: the addition task, the character tokenizer, a tiny Llama from a
config, the run's identity for resuming) feeds the same loops a real model would
(runtime.loop.run_in_process, runtime.ray_run.run_on_ray); `source` trains a Hugging Face model on a
data set instead (`--model`, `--dataset`). `toy_plan` is the plan of a toy run (one rollout group,
one trainer group, of a GPU-type label that is only a Ray resource on the local node).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from runtime.controller import LoopConfig
from runtime.episodes import agentic_run
from runtime.loop import run_in_process
from runtime.parallel import check_trainer_shape
from runtime.ray_run import run_on_ray
from runtime.run_result import RunResult, summarize
from runtime.settings import SYNC_TIMEOUT_S, Faults
from runtime.task import AdditionTask
from runtime.task_factory import SetupShape, TaskSource, build_setup
from runtime.tiny_moe import moe_tp_refusal
from runtime.trainer import TrainConfig
from traces import Cluster, Plan, RolloutGroup, SpecError, TrainerGroup
from traces.agentic import Agentic
from traces.moe import MoeSpec

TOY_GPU_TYPE = "CPU"  # the toy plan's type label; on CPU only a custom resource on the local node


def toy_plan(engines: int, staleness: int, gpu_type: str = TOY_GPU_TYPE, dp: int = 1, tp: int = 1) -> Plan:
    return Plan(mode="async", staleness=staleness, rollout=(RolloutGroup(gpu_type=gpu_type, instances=engines),),
                trainer=TrainerGroup(gpu_type=gpu_type, dp=dp, tp=tp))


def run_toy(steps: int, engines: int = 2, staleness: int = 2, seed: int = 0, out_dir: str | Path | None = None,
            prompts_per_step: int = 16, group_size: int = 16, train: TrainConfig | None = None,
            interruptible: bool = True, max_batch: int = 256, task: AdditionTask | None = None, hidden: int = 64,
            layers: int = 2, progress: Callable[[dict[str, Any]], None] | None = None,
            checkpoint_every: int = 0, resume: bool = False, identity: dict[str, Any] | None = None,
            response_cap: int | None = None, engine: str = "torch", heads: int = 4, kv_heads: int = 2,
            source: TaskSource | None = None, moe: MoeSpec | None = None,
            agentic: Agentic | None = None) -> RunResult:
    """Train the tiny Llama on digit addition (or `source`'s model on its data set) with async GRPO: one
    trainer, `engines` rollout engines (`engine`: "torch" or "vllm", runtime.engine_spec; vLLM on CPU
    needs a head size of 32 or more: heads=2 at hidden 64).

    Defaults are the measured ones that learn on two CPU cores in well under a minute: operands 0..4
    (9 answers, chance 1/9; with 0..9 and 19 answers the reward still crawls at ~0.1 after 200 steps:
    RL from a random model gets ~1/19 of a label per sample, too little information for the budget),
    16 prompts x 16 samples per step (bigger groups find a rewarded answer more often), Adam at 1e-3
    (2e-3 learns faster, then collapses) decaying linearly to 1e-4 by the last step (at a constant
    rate the policy keeps flipping answers late in the run), and a small entropy bonus.

    `resume`: continue the run in `out_dir` from its last checkpoint (runtime.records). `source`: a
    Hugging Face model on a data set instead of the toy (runtime.task_factory). `moe`: the toy's model has
    routed MLPs (a tiny Qwen3-MoE, runtime.tiny_moe) instead of the Llama's dense ones. `agentic`: every
    sample is a multi-turn episode with calculator calls (runtime.episodes).
    """
    shape = SetupShape(steps, engines, staleness, seed, prompts_per_step, group_size,
                       Path(out_dir) if out_dir is not None else None, resume)
    toy = build_setup(source, shape, train, identity, task, hidden, layers, heads, kv_heads, moe)
    config = LoopConfig(steps, prompts_per_step, group_size, staleness, checkpoint_every, response_cap=response_cap,
                        agentic=agentic_run(agentic, seed, toy.model.config))
    return summarize(toy, run_in_process(toy, config, engines, seed, max_batch, interruptible, progress, engine))


def run_toy_ray(steps: int, engines: int = 2, staleness: int = 2, seed: int = 0, out_dir: str | Path | None = None,
                prompts_per_step: int = 16, group_size: int = 16, train: TrainConfig | None = None,
                interruptible: bool = True, max_batch: int = 256, task: AdditionTask | None = None,
                hidden: int = 64, layers: int = 2, address: str | None = None,
                progress: Callable[[dict[str, Any]], None] | None = None, checkpoint_every: int = 0,
                resume: bool = False, identity: dict[str, Any] | None = None, faults: Faults | None = None,
                sync_timeout_s: float = SYNC_TIMEOUT_S, dp: int = 1, tp: int = 1, plan: Plan | None = None,
                cluster: Cluster | None = None, response_cap: int | None = None, executor: str = "ray",
                engine: str = "torch", heads: int = 4, kv_heads: int = 2,
                source: TaskSource | None = None, moe: MoeSpec | None = None,
            agentic: Agentic | None = None) -> RunResult:
    """`run_toy` with engines and trainer as Ray actors and real weight sync.

    Starts a local Ray on loopback (or joins `address`, or uses the Ray this process is connected to)
    and leaves it running for the caller to shut down (`ray.shutdown()`), so several runs share one
    start-up (runtime.ray_run). Dead engines are replaced; a dead trainer raises
    `runtime.ray_loop.TrainerLost`, and `resume=True` continues the run in `out_dir` from its last
    checkpoint (`checkpoint_every` steps, and at the end).

    `dp` > 1: that many data-parallel trainer ranks (runtime.parallel), one actor each; rank 0 syncs the
    weights and checkpoints, every rank loads the checkpoint on resume, and a dead rank is a dead trainer.
    `tp` > 1: each of the dp groups is tp ranks that split the model's heads and MLP (runtime.tensor_parallel).
    `plan`: run that plan's groups as planned (its engines, staleness, dp and tp replace `engines`,
    `staleness`, `dp` and `tp`), on `cluster`'s nodes where Ray names them; `response_cap`: new tokens per sample.
    """
    if plan is not None:
        engines, staleness = sum(g.instances for g in plan.rollout), plan.staleness
        dp, tp = plan.trainer.dp, plan.trainer.tp
    shape = SetupShape(steps, engines, staleness, seed, prompts_per_step, group_size,
                       Path(out_dir) if out_dir is not None else None, resume)
    toy = build_setup(source, shape, train, identity, task, hidden, layers, heads, kv_heads, moe)
    cfg = toy.model.config
    check_trainer_shape(dp, tp, 1, prompts_per_step, cfg.num_attention_heads, cfg.num_key_value_heads,
                        cfg.intermediate_size)
    if (why := moe_tp_refusal(cfg, tp)) is not None:
        raise SpecError(why)
    config = LoopConfig(steps, prompts_per_step, group_size, staleness, checkpoint_every, response_cap=response_cap,
                        agentic=agentic_run(agentic, seed, toy.model.config))
    finished = run_on_ray(plan or toy_plan(engines, staleness, dp=dp, tp=tp), toy, config, seed, max_batch,
                          interruptible, address, progress, faults, sync_timeout_s, cluster=cluster, executor=executor,
                          engine=engine)
    return summarize(toy, finished)
