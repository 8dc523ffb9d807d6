"""`rlfleet run`: execute a plan's RL loop (the toy task on CPU today) and record it.

By default engines and trainer are Ray actors placed by GPU type (runtime.ray_run: a local Ray on
loopback, or `--address` to join one) with weights broadcast over torch.distributed (gloo);
`--local` interleaves them in one process instead (runtime.loop), which is quicker to start.

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
dp must divide the step's 16 prompts (GRPO groups), and --local, one process, refuses it.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

from planner.commands.args import add_profile_arg, cost_model, emit, non_negative_seed, positive_float, positive_int
from planner.commands.fidelity import lines as fidelity_lines
from sim.fidelity import Fidelity, predict_run
from traces import CostModel, ModelSpec, Plan, SpecError, example_cluster, get_model, load_cluster, load_plan
from traces.io import ensure_folder
from traces.progress import bar
from traces.records import observed_workload, read_metrics, read_run, write_run_spec

TASKS = ("addition",)
PROMPTS_PER_STEP, GROUP_SIZE = 16, 16  # the toy run's batch: 256 samples a step (runtime.toy.run_toy)
EXIT_RUN_FAILED = 1  # the run itself failed (a dead trainer); bad input exits 2


def register(sub: Any) -> None:
    p = sub.add_parser("run", help="run a plan's RL loop on this machine (toy task on CPU) and record it")
    p.add_argument("plan", help="plan JSON file: its engine count and staleness bound are used")
    p.add_argument("--task", choices=TASKS, default="addition", help="verifiable task (default addition)")
    p.add_argument("--steps", type=positive_int, default=150, help="trainer steps (default 150)")
    p.add_argument("--seed", type=non_negative_seed, default=0, help="seed (default 0)")
    p.add_argument("--out", metavar="DIR", help="write metrics.jsonl, timeline.csv, checkpoints and model here")
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
    p.add_argument("--address", help="join this Ray cluster (default: start a local one on loopback)")
    p.add_argument("--local", action="store_true", help="run engines and trainer in this process, no Ray")
    p.add_argument("--cluster", help="cluster YAML the prediction assumes (default: this machine, cpu-host)")
    add_profile_arg(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=run)


def toy_model(plan: Plan) -> ModelSpec:
    """The plan's model, if the toy runtime can build it: a tiny-llama shape over the character vocabulary."""
    spec, tiny = get_model(plan.model or "tiny-llama"), get_model("tiny-llama")
    if (spec.vocab, spec.heads, spec.kv_heads, spec.intermediate) != (tiny.vocab, tiny.heads, tiny.kv_heads,
                                                                      4 * spec.hidden):
        raise SpecError(f"plan model {spec.name!r}: rlfleet run trains the toy task with a tiny-llama shape "
                        "(17-token vocabulary, 4 heads, 2 KV heads, MLP 4x hidden); use tiny-llama or tiny-llama-256")
    return spec


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
    try:
        import torch
        import transformers

        from runtime.parallel import check_dp
        from runtime.ray_loop import TrainerLost
        from runtime.toy import run_toy, run_toy_ray
        from runtime.trainer import TrainConfig
    except ImportError as exc:
        raise SpecError(f"rlfleet run needs the runtime extra ({exc.name} is missing): pip install -e '.[runtime]'"
                        ) from None
    plan = load_plan(args.plan)
    if plan.mode == "colocated":
        raise SpecError("rlfleet run executes async and sync plans; this plan is colocated")
    engines = sum(g.instances for g in plan.rollout)
    if engines > 16:
        raise SpecError(f"the plan has {engines} engines; on one CPU machine run at most 16 (use a smaller plan)")
    torch.set_num_threads(1)  # tiny matrices: a second OpenMP thread only contends (measured 10-100x slower)
    transformers.utils.logging.disable_progress_bar()
    if args.local and args.address:
        raise SpecError("--local runs without Ray; drop --address or --local")
    source = task_source(args)
    spec, no_spec = (toy_model(plan), "") if source.toy else hf_model_spec(source)
    task_name = args.task if source.toy else Path(args.dataset).stem
    dp = plan.trainer.dp
    check_dp(dp, PROMPTS_PER_STEP)
    if dp > 1 and args.local:
        raise SpecError(f"--local trains in one process; this plan's trainer has dp={dp} ranks (drop --local)")
    cluster = load_cluster(args.cluster) if args.cluster else example_cluster("cpu-host")
    cm = cost_model(args)
    folder = _run_folder(args)
    if folder:  # a file in the way is one line now, not after Ray and the engines have started
        ensure_folder(folder)
    with tempfile.TemporaryDirectory(prefix="rlfleet-run-") as scratch, \
            bar(args.steps, "training", unit="step") as progress:
        out = Path(folder or scratch)  # records are kept for the prediction either way
        common = {"engines": engines, "staleness": plan.staleness, "seed": args.seed, "out_dir": out,
                  "prompts_per_step": PROMPTS_PER_STEP,
                  "group_size": GROUP_SIZE, "progress": lambda row: _show(progress, row),
                  # checkpoints only where the user keeps the folder
                  "checkpoint_every": args.checkpoint_every if folder else 0,
                  "resume": args.resume is not None, "identity": {"plan": plan_shape(plan)}, "source": source}
        if source.toy and spec is not None:  # the toy's model is built to the plan's shape; a --model has its own
            common.update(hidden=spec.hidden, layers=spec.layers)
        try:
            if args.local:
                result = run_toy(args.steps, **common)
            else:
                import ray

                try:
                    result = run_toy_ray(args.steps, address=args.address, dp=dp, **common)
                finally:
                    ray.shutdown()
        except TrainerLost as exc:
            sys.stderr.write(f"rlfleet: error: {exc}\n")
            return EXIT_RUN_FAILED
        fid, why = None, no_spec
        if spec is not None:
            workload = observed_workload(f"{task_name}-observed", spec, plan, read_metrics(out),
                                         prompts_per_step=PROMPTS_PER_STEP, group_size=GROUP_SIZE,
                                         ppo_minibatches=TrainConfig().minibatches)
            write_run_spec(out, plan, workload, cluster)
            fid, why = _predict(out, cm, args)
    summary = {"steps": result.steps, "engines": engines, "trainer_dp": dp, "staleness_bound": plan.staleness,
               "eval_before": result.eval_before, "eval_after": result.eval_after, "chance": result.chance,
               "max_staleness": result.max_staleness, "samples_per_s": result.samples_per_s,
               "seconds": result.seconds, "out": folder, "executor": "local" if args.local else "ray",
               "version": result.version, "resumed_from": result.first_step if args.resume else None,
               "engine_restarts": result.engine_restarts, "samples_regenerated": len(result.requeued_sids),
               "duplicates_dropped": result.duplicates, "trainer_ranks": list(result.trainer_ranks),
               "prediction": fid.summary() if fid else {"skipped": why}}
    emit(summary, args.json, [
        f"{task_name}: {result.steps} steps, {engines} engines, "
        + (f"{dp} trainer ranks, " if dp > 1 else "") + f"staleness bound {plan.staleness}, "
        + ("in one process" if args.local else "on Ray")
        + (f", resumed from step {result.first_step}" if args.resume else ""),
        *([f"  faults    {result.engine_restarts} engine restarts, {len(result.requeued_sids)} samples "
           "re-generated, 0 lost"] if result.engine_restarts else []),
        f"  reward    {result.eval_before:.3f} -> {result.eval_after:.3f} (chance {result.chance:.3f}, "
        f"{result.eval_after / result.chance:.1f}x)",
        f"  staleness max {result.max_staleness} (bound {plan.staleness})",
        f"  speed     {result.samples_per_s:,.0f} samples/s over {result.seconds:.1f} s",
        *(fidelity_lines(fid) if fid else [f"  prediction skipped: {why}"]),
        *([f"  records -> {folder}"] if folder else []),
    ])
    return 0


def _show(progress: Any, row: dict[str, Any]) -> None:
    """One trained step on the bar: its throughput, reward and staleness."""
    progress.set_postfix({"samples/s": f"{row['samples_per_s']:.0f}", "reward": f"{row['mean_reward']:.3f}",
                          "staleness": row["max_staleness"]}, refresh=False)
    progress.update()


def _predict(out: Path, cm: CostModel, args: argparse.Namespace) -> tuple[Fidelity | None, str]:
    """Simulate the recorded run: (fidelity, or why there is no prediction)."""
    if args.local:
        return None, "--local runs engines and trainer in turns in one process; the simulator runs them in parallel"
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
