"""What of a plan and its workload a run executes, and what it refuses: checked before anything starts.

The plan is the run: its groups are placed as planned (runtime.placement), and the workload's batch
shape (prompts per step x group size), response cap (`response_len.max` new tokens), PPO
minibatches, mode, staleness and interruptible flag drive the loop (`RunShape`). A field the runtime
cannot honour is refused in one line (SpecError, exit 2 in the CLI), never dropped:
- trainer pp > 1 (pipeline parallelism is not built; tp > 1 runs: runtime.tensor_parallel);
- a fractional staleness bound (simulated, not run: the runtime's admission counts whole versions);
- an engine TP the engine kind cannot run (runtime.engine_factory.group_refusal: torch engines run tp 1);
- PPO (the runtime trains GRPO), a KL reference, rollout logprobs as the old policy (the runtime's
  loss recomputes the proximal policy);
- an agentic workload on the toy task (`agentic_refusal`: its character tokenizer cannot write a call).
An agentic workload's episodes run with real tool calls (runtime.episodes) on either engine kind;
its `turns` and `tool_tokens` distributions are the simulator's assumptions, and its `prefix_cache`
is the engine's own (the torch engine has none; vLLM's is on), said as not applied where they differ.
The workload's prompt lengths are not a directive: the task's prompts are what they are, and the run
records the lengths it saw (traces.records.observed_workload); nor is its reward latency (a run's
reward takes what it takes, and is said as not applied). The trainer's memory settings change
memory and speed, not the gradients, so a run goes ahead without them and says so (`not_applied`,
printed and recorded): ZeRO sharding across dp > 1 ranks (the ranks hold DDP replicas) and
activation recompute.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from traces import Cluster, Plan, RolloutGroup, SpecError, Workload
from traces.agentic import Agentic
from traces.plan_check import plan_problems

TOY_BATCH = (16, 16)  # prompts per step x group size without a workload: the toy run's measured default


def pp_refusal(pp: int) -> str | None:
    """Why a trainer of `pp` stages cannot run (None: it can): pipeline stages are not built in the runtime."""
    if pp != 1:
        return f"trainer pp={pp}: pipeline parallelism is not built in the runtime; use pp 1 (dp x tp ranks)"
    return None


@dataclass(frozen=True)
class RunShape:
    prompts_per_step: int
    group_size: int
    response_cap: int | None  # new tokens per sample; None: the task's own
    minibatches: int | None  # PPO minibatches per step; None: the trainer's default
    mode: str
    staleness: int
    interruptible: bool  # weight loads interrupt running samples (async mode only, as the simulator)
    not_applied: tuple[str, ...] = ()  # plan settings run without (memory and speed only), said to the user
    agentic: Agentic | None = None  # multi-turn episodes with tool calls (runtime.episodes)


def agentic_refusal(toy: bool) -> str | None:
    """Why an agentic workload's episodes cannot run on this task (None: they can)."""
    if toy:
        return ("workload agentic: the toy task's character tokenizer cannot write a calculator call; give "
                "--model DIR (python -m runtime.tiny_hf DIR --family qwen3_moe --tools) and --dataset "
                "runtime/data/calc.jsonl")
    return None


def run_shape(plan: Plan, workload: Workload | None, cluster: Cluster,
              refusal: Callable[[RolloutGroup, int], str | None], engine: str, toy: bool) -> RunShape:
    """The loop's shape for `plan` with `workload` (None: the toy batch at the plan's policy) on `engine`
    engines, or a SpecError naming everything it cannot honour; `toy`: the run trains the toy task."""
    problems = plan_problems(cluster, workload, plan)
    t = plan.trainer
    if (why := pp_refusal(t.pp)) is not None:
        problems.append(why)
    if plan.staleness != int(plan.staleness):
        problems.append(f"staleness {plan.staleness:g}: a fractional bound is simulated, not run; "
                        "plan with a whole number of versions")
    problems += [why for i, g in enumerate(plan.rollout) if (why := refusal(g, i)) is not None]
    if workload is not None:
        problems += _workload_problems(plan, workload)
        if workload.agentic is not None and (why := agentic_refusal(toy)) is not None:
            problems.append(why)
    if problems:
        raise SpecError("; ".join(problems))
    notes = _not_applied(plan)
    if workload is not None and workload.reward_seconds > 0:
        notes += (f"workload reward_seconds {workload.reward_seconds:g}: the simulator's reward latency; "
                  "this run's reward takes what it takes",)
    if workload is None:
        prompts, group = TOY_BATCH
        return RunShape(prompts, group, None, None, plan.mode, plan.staleness, plan.mode == "async", notes)
    if workload.agentic is not None:
        notes += _agentic_notes(workload.agentic, engine)
    return RunShape(workload.prompts_per_step, workload.group_size, workload.response_len.max,
                    workload.ppo_minibatches, plan.mode, plan.staleness, workload.interrupts(plan.mode), notes,
                    workload.agentic)


def _agentic_notes(agentic: Agentic, engine: str) -> tuple[str, ...]:
    out = ["workload agentic.turns and agentic.tool_tokens: the simulator's distributions; here the model decides "
           f"when to call (up to {agentic.turns.max} turns) and the tool's answers are what they are"]
    if agentic.prefix_cache and engine == "torch":
        out.append("workload agentic.prefix_cache: the torch engine re-prefills each turn's whole context "
                   "(it has no prefix cache)")
    if not agentic.prefix_cache and engine == "vllm":
        out.append("workload agentic.prefix_cache false: vLLM's own prefix cache stays on (reset at each weight load)")
    return tuple(out)


def _not_applied(plan: Plan) -> tuple[str, ...]:
    t = plan.trainer
    out = []
    if t.dp > 1 and t.zero_stage > 0:
        out.append(f"trainer zero_stage {t.zero_stage}: the {t.dp} ranks hold full replicas (DDP); "
                   "same gradients, more memory")
    if t.recompute != "none":
        out.append(f"trainer recompute {t.recompute}: activations are kept; same gradients, more memory")
    return tuple(out)


def _workload_problems(plan: Plan, workload: Workload) -> list[str]:
    out = []
    if plan.model and workload.model.name != plan.model:
        out.append(f"the plan is for model {plan.model} but the workload's is {workload.model.name}; "
                   "give the workload the plan was made for")
    if workload.algorithm != "grpo":
        out.append(f"workload algorithm {workload.algorithm}: the runtime trains GRPO; set algorithm: grpo")
    if workload.kl_reference:
        out.append("workload kl_reference: the runtime's loss has no KL term to a reference policy; "
                   "set kl_reference: false")
    if workload.rollout_logprobs:
        out.append("workload rollout_logprobs: the runtime recomputes the proximal policy (decoupled loss); "
                   "set rollout_logprobs: false")
    if workload.lora_rank:
        out.append(f"workload lora_rank {workload.lora_rank}: the runtime trains every weight (no adapter; its "
                   "engines load whole weights); LoRA jobs are planned, simulated and exported: set lora_rank: 0 "
                   "to run")
    if workload.train_microbatch_tokens is not None:
        out.append(f"workload train_microbatch_tokens {workload.train_microbatch_tokens}: the runtime's trainer "
                   "takes each minibatch in one pass; leave it unset to run")
    return out
