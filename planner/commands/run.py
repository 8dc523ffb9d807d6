"""`rlfleet run`: execute a plan's RL loop (the toy task on CPU today) and record it.

By default engines and trainer are Ray actors placed by GPU type (runtime.ray_run: a local Ray on
loopback, or `--address` to join one) with weights broadcast over torch.distributed (gloo);
`--local` interleaves them in one process instead (runtime.loop), which is quicker to start.

With `--out DIR` a checkpoint is committed every `--checkpoint-every` steps (default 1: a crash
redoes at most the step in progress); `--resume DIR` continues that run (a dead trainer's, or one
stopped early, or one to extend with more `--steps`). A folder without a checkpoint, or with one of
another plan, task or seed, is refused in one line (exit 2). A dead rollout engine is replaced
without stopping the run; a dead trainer stops it with one line (exit 1) naming the checkpoint.

A plan whose trainer has dp > 1 trains on that many data-parallel ranks (Ray actors, runtime.parallel);
dp must divide the step's 16 prompts (GRPO groups), and --local, one process, refuses it.

`--engine vllm|torch`: every rollout group's engines are vLLM (`VllmEngine`, with the group's tp as
`tensor_parallel_size`) or the torch engine, behind the same controller. The default is vLLM where
it can run the plan's engines here (runtime.engine_spec.vllm_blocker: installed; on CPU a head size
its kernels take, tp 1, and for --local a process started with its OpenMP preloaded), else torch;
the summary names the engine used. An explicit `--engine vllm` that cannot run is refused in one line.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

from planner.commands.args import add_profile_arg, cost_model, emit, non_negative_seed, positive_int
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
    p.add_argument("--address", help="join this Ray cluster (default: start a local one on loopback)")
    p.add_argument("--local", action="store_true", help="run engines and trainer in this process, no Ray")
    p.add_argument("--engine", choices=("vllm", "torch"), help="rollout engines: vllm or torch (default: vllm "
                   "where it can run the plan's engines here, else torch)")
    p.add_argument("--cluster", help="cluster YAML the prediction assumes (default: this machine, cpu-host)")
    add_profile_arg(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=run)


def toy_model(plan: Plan) -> ModelSpec:
    """The plan's model, if the toy runtime can build it: a tiny-llama shape over the character vocabulary."""
    spec, tiny = get_model(plan.model or "tiny-llama"), get_model("tiny-llama")
    if (spec.vocab, spec.intermediate) != (tiny.vocab, 4 * spec.hidden) or spec.hidden % spec.heads \
            or spec.heads % spec.kv_heads:
        raise SpecError(f"plan model {spec.name!r}: rlfleet run trains the toy task with a tiny-llama shape "
                        "(17-token vocabulary, heads dividing hidden, MLP 4x hidden); use tiny-llama, "
                        "tiny-llama-h32 or tiny-llama-256")
    return spec


def choose_engine(plan: Plan, spec: ModelSpec, asked: str | None, local: bool) -> str:
    """The rollout engine of this run: `asked` if it can run here (else SpecError), or the default."""
    from runtime.engine_spec import check_engine, default_engine
    from runtime.model import CharTokenizer, tiny_llama_config

    config = tiny_llama_config(CharTokenizer(), spec.layers, spec.hidden, spec.heads, spec.kv_heads, spec.intermediate)
    tps = tuple(g.tp for g in plan.rollout)
    engine = asked or default_engine(config, tps, in_process=local)
    check_engine(engine, config, tps, in_process=local)
    return engine


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
    spec = toy_model(plan)
    engine = choose_engine(plan, spec, args.engine, args.local)
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
                  "hidden": spec.hidden, "layers": spec.layers, "heads": spec.heads, "kv_heads": spec.kv_heads,
                  "engine": engine, "prompts_per_step": PROMPTS_PER_STEP,
                  "group_size": GROUP_SIZE, "progress": lambda row: _show(progress, row),
                  # checkpoints only where the user keeps the folder
                  "checkpoint_every": args.checkpoint_every if folder else 0,
                  "resume": args.resume is not None, "identity": {"plan": plan_shape(plan)}}
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
        workload = observed_workload(f"{args.task}-observed", spec, plan, read_metrics(out),
                                     prompts_per_step=PROMPTS_PER_STEP, group_size=GROUP_SIZE,
                                     ppo_minibatches=TrainConfig().minibatches)
        write_run_spec(out, plan, workload, cluster)
        fid, why = _predict(out, cm, args)
    summary = {"steps": result.steps, "engines": engines, "engine": engine, "trainer_dp": dp,
               "staleness_bound": plan.staleness,
               "eval_before": result.eval_before, "eval_after": result.eval_after, "chance": result.chance,
               "max_staleness": result.max_staleness, "samples_per_s": result.samples_per_s,
               "seconds": result.seconds, "out": folder, "executor": "local" if args.local else "ray",
               "version": result.version, "resumed_from": result.first_step if args.resume else None,
               "engine_restarts": result.engine_restarts, "samples_regenerated": len(result.requeued_sids),
               "duplicates_dropped": result.duplicates, "trainer_ranks": list(result.trainer_ranks),
               "engine_actors": list(result.engines),
               "prediction": fid.summary() if fid else {"skipped": why}}
    emit(summary, args.json, [
        f"{args.task}: {result.steps} steps, {engines} {engine} engines, "
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
