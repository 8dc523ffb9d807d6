"""`rlfleet run`: execute a plan as planned (the toy task on CPU today) and record it.

The plan is the run (runtime.run_plan): one Ray placement group per plan group, each rollout group
with its engine count (and TP, where the engine kind runs it), the trainer with its dp, bundles keyed
by the group's GPU type (`accelerator_type:<TYPE>`) and pinned to the nodes the plan assigned where
the Ray cluster names them. `--workload FILE` gives the batch shape (prompts per step x group size),
response cap, mode, staleness and interruptible flag (without one: the toy batch, 16 x 16, at the
plan's mode and staleness); `--cluster FILE` the machines. A plan field the runtime cannot honour
(trainer pp > 1 or tp > 1, engine tp > 1 on torch engines, ...) is refused in one line (exit 2)
before anything starts.

Where: `--local` (the default without `--address`) starts a local Ray cluster of fake nodes that
mirror the cluster file's nodes (runtime.local_cluster: CPU bundles standing in for GPUs, labelled
with their GPU types), so the same plan and placement code run on a CPU-only machine; a cluster or
plan too large for it is refused with what it would need. `--address RAY` joins a real cluster.
`--in-process` interleaves engines and trainer in one process instead (runtime.loop), no Ray, no
placement, which is quicker to start. The run folder records who ran where (placement.json) and
per-group phase times (phases.json); `rlfleet fidelity` compares them with a simulation.

With `--out DIR` a checkpoint is committed every `--checkpoint-every` steps (default 1: a crash
redoes at most the step in progress); `--resume DIR` continues that run (a dead trainer's, or one
stopped early, or one to extend with more `--steps`). A folder without a checkpoint, or with one of
another plan, task or seed, is refused in one line (exit 2). A dead rollout engine is replaced
without stopping the run; a dead trainer stops it with one line (exit 1) naming the checkpoint.

`--model DIR --dataset FILE` trains a local Hugging Face causal LM (with its tokenizer and chat
template) on a JSONL or parquet data set instead of the toy, scored by `--reward` (math, addition or
module:function); runtime.task_factory builds it. `python -m runtime.tiny_hf DIR` writes a tiny model
to try it with, and runtime/data/arith_word.jsonl is a small data set.

A plan whose trainer has dp > 1 trains on that many data-parallel ranks (Ray actors, runtime.parallel);
dp must divide the step's prompts (GRPO groups). tp > 1 splits each rank's model over tp ranks
(runtime.tensor_parallel; tp must divide the heads, KV heads and MLP columns). pp > 1 is refused, and
--in-process, one process, refuses more than one trainer rank.

`--engine vllm|torch`: every rollout group's engines are vLLM (`VllmEngine`, with the group's tp as
`tensor_parallel_size`) or the torch engine, behind the same controller. The default is vLLM where
it can run the plan's engines here (runtime.engine_spec.vllm_blocker: installed; on CPU a head size
its kernels take, tp 1, and for --in-process a process started with its OpenMP preloaded), else torch;
the summary names the engine used. An explicit `--engine vllm` that cannot run is refused in one line.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from planner.commands.args import add_profile_arg, cost_model, emit, non_negative_seed, positive_float, positive_int
from planner.commands.fidelity import lines as fidelity_lines
from sim.fidelity import Fidelity, predict_run
from traces import (
    CostModel,
    ModelSpec,
    Plan,
    SpecError,
    Workload,
    example_cluster,
    get_model,
    load_cluster,
    load_plan,
    load_workload,
)
from traces.io import atomic_write_text, ensure_folder
from traces.progress import bar
from traces.ray_address import check_ray_address, probe_ray_address
from traces.records import RUN_FILE, observed_workload, read_metrics, read_run, write_run_spec

TASKS = ("addition",)
EXIT_RUN_FAILED = 1  # the run itself failed (a dead trainer); bad input exits 2
MAX_IN_PROCESS_ENGINES = 16  # engines interleaved in one process: more only slow every step
MAX_BATCH = 256  # running sequences per engine where the plan sets no cap (vLLM's max_num_seqs default)


def register(sub: Any) -> None:
    p = sub.add_parser("run", help="execute a plan's RL loop as planned (toy task on CPU) and record it")
    p.add_argument("plan", help="plan JSON file: its groups are placed and run as planned")
    p.add_argument("--cluster", help="cluster YAML the plan is for; --local mirrors its nodes "
                   "(default: this machine, cpu-host)")
    p.add_argument("--workload", help="workload YAML: batch shape, response cap, mode, staleness, interruptible "
                   "(default: the toy batch, 16 prompts x 16 samples, at the plan's mode and staleness)")
    p.add_argument("--task", choices=TASKS, default="addition", help="verifiable task (default addition)")
    p.add_argument("--steps", type=positive_int, default=150, help="trainer steps (default 150)")
    p.add_argument("--seed", type=non_negative_seed, default=0, help="seed (default 0)")
    p.add_argument("--out", metavar="DIR", help="write metrics, timeline, placement, checkpoints and model here")
    p.add_argument("--resume", metavar="DIR", help="continue the run in DIR from its last checkpoint "
                   "(same plan, task and seed; --steps is the total, and may extend the run)")
    p.add_argument("--checkpoint-every", type=positive_int, default=1, metavar="N",
                   help="commit a checkpoint every N steps when writing a run folder (default 1)")
    p.add_argument("--model", metavar="DIR", help="a local Hugging Face causal LM folder to train (with "
                   "--dataset); default: the toy task's tiny Llama")
    p.add_argument("--dataset", metavar="FILE", help="JSONL or parquet with a prompt and an answer field")
    p.add_argument("--prompt-field", metavar="NAME", help="the data set's prompt field (default prompt)")
    p.add_argument("--answer-field", metavar="NAME", help="the data set's answer field (default answer)")
    p.add_argument("--reward", metavar="NAME", help="math (final answer: boxed or last number), addition (the "
                   "whole response), or module:function(response, answer) -> float (default math)")
    p.add_argument("--max-new-tokens", type=positive_int, metavar="N", help="response cap with --dataset "
                   "(default 256)")
    p.add_argument("--lr", type=positive_float, metavar="LR", help="Adam's learning rate (default 1e-3 on the toy, "
                   "1e-6 with --model)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--address", help="join this Ray cluster")
    where.add_argument("--local", action="store_true", help="start a local Ray cluster of fake nodes mirroring "
                       "--cluster (the default without --address)")
    where.add_argument("--in-process", action="store_true", help="run engines and trainer in this process, "
                       "no Ray and no placement (quick)")
    p.add_argument("--engine", choices=("vllm", "torch"), help="rollout engines: vllm or torch (default: vllm "
                   "where it can run the plan's engines here, else torch)")
    add_profile_arg(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=run)


def toy_model(plan: Plan, workload: Workload | None) -> ModelSpec:
    """The plan's model, if the toy runtime can build it: a tiny-llama shape over the character vocabulary
    (with a `moe` block: the same attention over routed MLPs, a tiny Qwen3-MoE)."""
    spec = workload.model if workload is not None else get_model(plan.model or "tiny-llama")
    tiny = get_model("tiny-llama")
    if (spec.vocab, spec.intermediate) != (tiny.vocab, 4 * spec.hidden) or spec.hidden % spec.heads \
            or spec.heads % spec.kv_heads or (spec.moe is not None and (spec.moe.shared_experts or spec.moe.biases)):
        raise SpecError(f"plan model {spec.name!r}: rlfleet run trains the toy task with a tiny-llama shape "
                        "(17-token vocabulary, heads dividing hidden, MLP 4x hidden, routed experts only); use "
                        "tiny-llama, tiny-llama-h32, tiny-llama-256 or tiny-qwen3-moe")
    return spec


def choose_engine(plan: Plan, config: Any, asked: str | None, in_process: bool) -> str:
    """The rollout engine of this run: `asked`, or the default (vLLM where it can run every group here,
    runtime.engine_spec.default_engine); what it cannot run is refused by engine_factory.group_refusal."""
    from runtime.engine_spec import default_engine

    return asked or default_engine(config, tuple(g.tp for g in plan.rollout), in_process=in_process)


def engine_config(source: Any, spec: ModelSpec | None) -> Any:
    """The model config the engines' refusals read: the --model folder's, or the toy's built to `spec`."""
    if not source.toy:
        from transformers import AutoConfig

        from runtime.hf_model import check_folder

        return AutoConfig.from_pretrained(str(check_folder(source.model)))  # a bad folder: one line first
    from runtime.model import CharTokenizer, toy_config

    assert spec is not None
    return toy_config(CharTokenizer(), spec.layers, spec.hidden, spec.heads, spec.kv_heads, spec.moe)


def task_source(args: argparse.Namespace) -> Any:
    """The run's runtime.task_factory.TaskSource; a data-set flag on the toy task is refused, not ignored."""
    from runtime.task_factory import TaskSource

    data_flags = {"--prompt-field": "prompt_field", "--answer-field": "answer_field", "--reward": "reward",
                  "--max-new-tokens": "max_new_tokens"}
    given = {field: getattr(args, field) for field in data_flags.values() if getattr(args, field) is not None}
    if args.dataset is None and given:
        flag = next(f for f, field in data_flags.items() if field in given)
        raise SpecError(f"{flag} applies to --dataset runs; the toy task has its own prompts, reward and cap")
    source = TaskSource(model=args.model, dataset=args.dataset, lr=args.lr, **given)
    source.check()
    return source


def hf_model_spec(source: Any) -> tuple[ModelSpec | None, str]:
    """The --model folder's architecture for the records and the prediction (traces.hf_config), or why
    the simulator cannot describe it (the run still runs; only its prediction is skipped)."""
    from traces.hf_config import default_name, model_from_hf
    from traces.io import load_yaml

    config = Path(source.model) / "config.json"
    try:
        return model_from_hf(load_yaml(config), default_name(config), f"--model {source.model}"), ""
    except SpecError as exc:
        return None, f"the simulator cannot describe this model ({exc})"


def run(args: argparse.Namespace) -> int:
    if args.address is not None:  # in a second, before torch's import; ray.init retries a dead head for minutes
        probe_ray_address(check_ray_address(args.address), "drop --address to run on a local cluster")
    try:
        import torch
        import transformers

        from runtime.engine_factory import group_refusal
        from runtime.local_cluster import check_fits, local_cluster
        from runtime.parallel import check_trainer_shape
        from runtime.ray_loop import TrainerLost
        from runtime.run_plan import run_shape
        from runtime.task_factory import HF_LR, TOY_ENTROPY, TOY_LR
        from runtime.tiny_moe import moe_tp_refusal
        from runtime.toy import run_toy, run_toy_ray
        from runtime.trainer import TrainConfig
    except ImportError as exc:
        raise SpecError(f"rlfleet run needs the runtime extra ({exc.name} is missing): pip install -e '.[runtime]'"
                        ) from None
    plan = load_plan(args.plan)
    cluster = load_cluster(args.cluster) if args.cluster else example_cluster("cpu-host")
    workload = load_workload(args.workload) if args.workload else None
    # every refusal comes before Ray, the engines or the run folder start
    source = task_source(args)
    spec, no_spec = (toy_model(plan, workload), "") if source.toy else hf_model_spec(source)
    task_name = args.task if source.toy else Path(args.dataset).stem
    config = engine_config(source, spec)
    engine = choose_engine(plan, config, args.engine, args.in_process)
    shape = run_shape(plan, workload, cluster, group_refusal(engine, config, args.in_process), engine, source.toy)
    dp, tp = plan.trainer.dp, plan.trainer.tp
    heads = config.num_attention_heads
    check_trainer_shape(dp, tp, plan.trainer.pp, shape.prompts_per_step, heads,
                        getattr(config, "num_key_value_heads", None) or heads, config.intermediate_size)
    if (why := moe_tp_refusal(config, tp)) is not None:
        raise SpecError(why)
    engines = sum(g.instances for g in plan.rollout)
    if args.in_process and dp * tp > 1:
        raise SpecError(f"--in-process trains in one process; this plan's trainer has dp={dp} x tp={tp} ranks "
                        "(drop --in-process)")
    if args.in_process and engines > MAX_IN_PROCESS_ENGINES:
        raise SpecError(f"the plan has {engines} engines; --in-process interleaves at most "
                        f"{MAX_IN_PROCESS_ENGINES} (run it on Ray: drop --in-process)")
    caps = sorted({plan.running_cap(g, MAX_BATCH) for g in plan.rollout})
    if args.in_process and len(caps) > 1:
        raise SpecError(f"--in-process runs every engine at one running cap; this plan's groups ask "
                        f"{', '.join(map(str, caps))} (run it on Ray: drop --in-process)")
    local = not args.in_process and args.address is None
    if local:
        check_fits(cluster, plan)
    torch.set_num_threads(1)  # tiny matrices: a second OpenMP thread only contends (measured 10-100x slower)
    transformers.utils.logging.disable_progress_bar()
    cm = cost_model(args)
    folder = _run_folder(args)
    if folder:  # a file in the way is one line now, not after Ray and the engines have started
        ensure_folder(folder)
    executor = "in-process" if args.in_process else ("ray-local" if local else "ray")
    lr = source.lr or (TOY_LR if source.toy else HF_LR)
    train = (TrainConfig(lr=lr, entropy_coef=TOY_ENTROPY if source.toy else 0.0, decay_steps=args.steps,
                         minibatches=shape.minibatches) if shape.minibatches is not None else None)
    with tempfile.TemporaryDirectory(prefix="rlfleet-run-") as scratch, \
            bar(args.steps, "training", unit="step") as progress:
        out = Path(folder or scratch)  # records are kept for the prediction either way
        common = {"engines": engines, "staleness": plan.staleness, "seed": args.seed, "out_dir": out,
                  "prompts_per_step": shape.prompts_per_step,
                  "group_size": shape.group_size, "progress": lambda row: _show(progress, row),
                  "interruptible": shape.interruptible, "response_cap": shape.response_cap, "train": train,
                  "max_batch": caps[0] if args.in_process else MAX_BATCH,  # on Ray: each group's own cap
                  "engine": engine,
                  # checkpoints only where the user keeps the folder
                  "checkpoint_every": args.checkpoint_every if folder else 0,
                  "resume": args.resume is not None, "identity": {"plan": plan_shape(plan)}, "source": source,
                  "agentic": shape.agentic}
        if source.toy and spec is not None:  # the toy's model is built to the plan's shape; a --model has its own
            common.update(hidden=spec.hidden, layers=spec.layers, heads=spec.heads, kv_heads=spec.kv_heads,
                          moe=spec.moe)
        try:
            if args.in_process:
                result = run_toy(args.steps, **common)
            elif local:
                with local_cluster(cluster, plan):
                    result = run_toy_ray(args.steps, plan=plan, cluster=cluster, executor=executor, **common)
            else:
                import ray

                try:
                    result = run_toy_ray(args.steps, address=args.address, plan=plan, cluster=cluster,
                                         executor=executor, **common)
                finally:
                    ray.shutdown()
        except TrainerLost as exc:
            sys.stderr.write(f"rlfleet: error: {exc}\n")
            return EXIT_RUN_FAILED
        fid, why = None, no_spec
        if shape.agentic is not None:  # the recorded lengths are whole episodes, not one turn's answer
            why = ("an agentic run (its recorded lengths are whole episodes; the simulator's agentic model is "
                   "not compared yet)")
        elif spec is not None:
            observed = observed_workload(f"{task_name}-observed", spec, plan, read_metrics(out),
                                         prompts_per_step=shape.prompts_per_step, group_size=shape.group_size,
                                         ppo_minibatches=(train or TrainConfig()).minibatches)
            write_run_spec(out, plan, observed.model_copy(update={"interruptible": shape.interruptible}), cluster)
            fid, why = _predict(out, cm, args)
    summary = {"steps": result.steps, "engines": engines, "engine": engine, "trainer_dp": dp, "trainer_tp": tp,
               "staleness_bound": plan.staleness, "mode": plan.mode,
               "batch": [shape.prompts_per_step, shape.group_size],
               "eval_before": result.eval_before, "eval_after": result.eval_after, "chance": result.chance,
               "max_staleness": result.max_staleness, "samples_per_s": result.samples_per_s,
               "seconds": result.seconds, "out": folder, "executor": executor,
               "version": result.version, "resumed_from": result.first_step if args.resume else None,
               "engine_restarts": result.engine_restarts, "samples_regenerated": len(result.requeued_sids),
               "duplicates_dropped": result.duplicates, "samples_trained": result.samples,
               "trainer_ranks": list(result.trainer_ranks), "placement": result.placement,
               "not_applied": list(shape.not_applied),
               "engine_actors": list(result.engines), "tool_calls": result.tool_calls,
               "prediction": fid.summary() if fid else {"skipped": why}}
    if folder:
        atomic_write_text(Path(folder) / RUN_FILE, json.dumps(summary, indent=1) + "\n")
    where = {"in-process": "in one process", "ray-local": "on a local Ray cluster of fake nodes",
             "ray": "on Ray"}[executor]
    emit(summary, args.json, [
        f"{task_name}: {result.steps} steps, {plan.mode}, {engines} {engine} engines in {len(plan.rollout)} group(s), "
        + (f"{dp * tp} trainer ranks (dp {dp} x tp {tp}), " if dp * tp > 1 else "")
        + f"staleness bound {plan.staleness}, {where}"
        + (f", resumed from step {result.first_step}" if args.resume else ""),
        *_placement_lines(result.placement),
        *(f"  not applied: {note}" for note in shape.not_applied),
        *([f"  faults    {result.engine_restarts} engine restarts, {len(result.requeued_sids)} samples "
           "re-generated, 0 lost"] if result.engine_restarts else []),
        f"  reward    {result.eval_before:.3f} -> {result.eval_after:.3f} (chance {result.chance:.3f}, "
        f"{result.eval_after / result.chance:.1f}x)",
        f"  staleness max {result.max_staleness} (bound {plan.staleness})",
        *([f"  tools     {result.tool_calls} tool calls recorded (up to {shape.agentic.turns.max} turns per episode)"]
          if shape.agentic is not None else []),
        f"  speed     {result.samples_per_s:,.0f} samples/s over {result.seconds:.1f} s",
        *(fidelity_lines(fid) if fid else [f"  prediction skipped: {why}"]),
        *([f"  records -> {folder}"] if folder else []),
    ])
    return 0


def _placement_lines(placement: dict[str, Any] | None) -> list[str]:
    """One line per plan group: its actors and the nodes (index and GPU-type label) they landed on."""
    if placement is None:
        return []
    lines = []
    for group in placement["groups"]:
        actors = [a for a in placement["actors"] if a["group"] == group["group"]]
        nodes = sorted({(a["node_index"], a["node_gpu_type"]) for a in actors}, key=str)
        lines.append(f"  {group['group']:<9} {len(actors)} x {group['gpu_type']} on node(s) "
                     + ", ".join(f"{i} ({t})" for i, t in nodes))
    return lines


def _show(progress: Any, row: dict[str, Any]) -> None:
    """One trained step on the bar: its throughput, reward and staleness."""
    progress.set_postfix({"samples/s": f"{row['samples_per_s']:.0f}", "reward": f"{row['mean_reward']:.3f}",
                          "staleness": row["max_staleness"]}, refresh=False)
    progress.update()


def _predict(out: Path, cm: CostModel, args: argparse.Namespace) -> tuple[Fidelity | None, str]:
    """Simulate the recorded run: (fidelity, or why there is no prediction)."""
    if args.in_process:
        return None, ("--in-process runs engines and trainer in turns in one process; the simulator runs them "
                      "in parallel")
    if args.resume:
        return None, "a resumed run (its clock restarts, so its timeline spans the outage)"
    try:
        return predict_run(read_run(out), cm, seed=args.seed), ""
    except SpecError as exc:  # e.g. the plan's GPU types are not in the cluster the prediction assumes
        return None, str(exc)


def _run_folder(args: argparse.Namespace) -> str | None:
    """--resume DIR writes on in DIR; an --out elsewhere would split the run's records in two."""
    if args.resume is None:
        return args.out
    if args.out is not None and Path(args.out).resolve() != Path(args.resume).resolve():
        raise SpecError("--resume DIR continues the run in DIR; drop --out (or give the same folder)")
    return args.resume


def plan_shape(plan: Plan) -> str:
    """What of a plan a resumed run must share with its checkpoint: the groups, mode and bound
    (not its name fields or predictions)."""
    t = plan.trainer
    rollout = ", ".join(f"{g.instances}x {g.gpu_type} tp{g.tp}" for g in plan.rollout)
    return (f"{plan.model or 'tiny-llama'}, {plan.mode} eta={plan.staleness}; rollout {rollout}; "
            f"trainer {t.gpu_type} dp{t.dp} tp{t.tp} pp{t.pp}")
