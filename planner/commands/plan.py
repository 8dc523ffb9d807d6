"""`rlfleet plan`: the best allocation of a fleet to rollout and training, with baselines."""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

from planner.bounds import MAX_SIMULATIONS, PLAN_SECONDS, SETTLING_RUNS
from planner.commands.args import (
    add_executor_args,
    add_profile_arg,
    cost_model,
    emit,
    non_negative_seed,
    positive_float,
    positive_int,
)
from planner.exports import summary, summary_lines
from traces import SpecError, Workload, load_cluster, load_workload
from traces.io import check_target
from traces.records import recommended_steps


def register(sub: Any) -> None:
    p = sub.add_parser("plan", help="plan rollout and training on a fleet (MILP, re-ranked by the simulator)")
    p.add_argument("--cluster", required=True, help="cluster YAML file")
    p.add_argument("--workload", required=True, help="workload YAML file")
    p.add_argument("--objective", choices=("throughput", "cost", "pareto"), default="throughput",
                   help="throughput: most samples/s (within --budget); cost: cheapest plan reaching --target; "
                        "pareto: the min-cost frontier over targets (the MILP's, each point also simulated)")
    p.add_argument("--budget", type=positive_float, metavar="DOLLARS_PER_HOUR", help="spend at most this per hour")
    p.add_argument("--target", type=positive_float, metavar="SAMPLES_PER_S", help="throughput to reach (cost)")
    p.add_argument("--top-k", type=positive_int, default=3, help="MILP solutions to simulate and re-rank (default 3)")
    p.add_argument("--sim-steps", type=positive_int, default=None,
                   help="trainer steps per simulation (default: warm-up plus one steady period, 2 (staleness + 1), "
                        "at least 8)")
    p.add_argument("--no-settle", action="store_true",
                   help="score the answer and the baselines over the screening window alone (faster; it can overstate "
                        "a plan whose slow steps recur less often than every staleness + 1 steps) instead of "
                        "confirming them with settling runs (see `rlfleet simulate --until-settled`)")
    p.add_argument("--seed", type=non_negative_seed, default=0, help="simulation seed (default 0)")
    p.add_argument("--solver", choices=("auto", "highs", "cbc"), default="auto", help="MILP solver (default auto)")
    p.add_argument("--no-baselines", action="store_true", help="skip planning and simulating the baselines")
    p.add_argument("--no-marginal", action="store_true",
                   help="skip the marginal values (what one more node of each GPU type buys: one MILP per type)")
    p.add_argument("--milp-only", action="store_true",
                   help="the MILP and placement alone (its best solution per network tier, analytic figures): no "
                        "simulation, no re-ranking or refinement, no baselines, no marginal values; the fastest "
                        "answer, for sweeps and re-planning")
    p.add_argument("--max-seconds", type=positive_float, default=PLAN_SECONDS,
                   help=f"wall-clock bound of the whole search (default {PLAN_SECONDS:g}); the best plan found by "
                        "then is returned, with a note")
    p.add_argument("--max-simulations", type=positive_int, default=MAX_SIMULATIONS,
                   help="simulations at most: each plan's screening run and each settling run count one, and "
                        f"the last {SETTLING_RUNS} are kept for settling runs (at most half); the baselines' runs "
                        f"are not counted (default {MAX_SIMULATIONS})")
    p.add_argument("--framework", choices=("areal", "verl"),
                   help="search only plans this framework launches as they are (one rollout engine kind on whole "
                        "nodes), so `rlfleet export` writes exactly the simulated plan; compared with the free plan")
    p.add_argument("--out", metavar="PLAN_JSON", help="write the chosen plan (traces plan format) here")
    add_executor_args(p, "the pareto sweep's points (--objective pareto)")
    add_profile_arg(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from planner.api import plan_report
    from planner.executors import Executor
    from planner.sweeps import pareto

    if args.objective != "pareto" and (args.executor or args.ray_address):
        raise SpecError("--executor and --ray-address place the points of --objective pareto; drop them for "
                        f"--objective {args.objective}")
    executor = Executor(args.executor or "auto", args.ray_address) if args.executor or args.ray_address else None
    cluster, workload = load_cluster(args.cluster), load_workload(args.workload)
    if args.out:  # a bad output path is one line now, not after planning
        check_target(args.out)
    if args.milp_only and args.objective == "pareto":
        raise SpecError("--milp-only plans one request and --objective pareto a frontier of them; drop one")
    if args.objective == "pareto":
        eta = workload.staleness if workload.mode == "async" else 0
        frame = pareto(cluster, workload, solver=args.solver, cost_model=cost_model(args),
                       sim_steps=args.sim_steps or recommended_steps(eta), seed=args.seed, executor=executor)
        emit({"pareto": frame.to_dict(orient="records")}, args.json,
             ["min-cost plans by target (samples_per_s: the MILP's analytic figure; simulated_samples_per_s: "
              "the same plan simulated):", frame.round(3).to_string(index=False)])
        return 0
    if not args.json and sys.stderr.isatty():
        sys.stderr.write("planning: solving the MILP, then simulating the top plans and baselines...\n")
    alone = {"top_k": 1, "sim_steps": 0, "baselines": False, "marginal": False, "refine": 0, "explore": 0}
    asked = {"top_k": args.top_k, "sim_steps": args.sim_steps, "baselines": not args.no_baselines,
             "marginal": not args.no_marginal, "settle": not args.no_settle}
    report = plan_report(cluster, workload, objective=args.objective, budget=args.budget, target=args.target,
                         solver=args.solver, seed=args.seed, cost_model=cost_model(args), framework=args.framework,
                         max_seconds=args.max_seconds, max_simulations=args.max_simulations,
                         **(alone if args.milp_only else asked))  # type: ignore[arg-type]
    if args.out:
        report.plan.save(args.out)
    result = {**report.summary(), "exports": summary(report.plan, cluster, workload),
               "plan": report.plan.model_dump(mode="json")}
    emit(result, args.json, _lines(report, result, args, workload))
    return 0


def _nodes(nodes: tuple[int, ...]) -> str:
    if not nodes:
        return ""
    return f" (node {nodes[0]})" if len(nodes) == 1 else f" (nodes {nodes[0]}-{nodes[-1]})"


def _trained(workload: Workload) -> str:
    """What the trainer trains and how it runs, where not the defaults (full weights, fused kernels)."""
    parts = ([f"LoRA rank {workload.lora_rank}"] if workload.lora_rank else []) + (
        ["eager kernels"] if workload.trainer_kernels == "eager" else [])
    return f", {', '.join(parts)}" if parts else ""


def _lines(report: Any, summary: dict[str, Any], args: argparse.Namespace, workload: Workload) -> list[str]:
    plan, s = report.plan, report.chosen.solution
    t = plan.trainer
    lines = [f"plan for {plan.workload or 'workload'} on {plan.cluster or 'cluster'}: {plan.mode}"
             + (f", staleness {plan.staleness}" if plan.mode == "async" else "")]
    for g in plan.rollout:
        ep = f" EP{g.ep}" if g.ep > 1 else ""  # expert parallelism (MoE models)
        lines.append(f"  rollout   {g.instances} x {g.gpu_type} TP{g.tp}{ep} engines{_nodes(g.nodes)}")
    ep = f" ep{t.ep}" if t.ep > 1 else ""
    lines.append(f"  trainer   {t.gpus} {t.gpu_type}: dp{t.dp} tp{t.tp} pp{t.pp}{ep}, ZeRO-{t.zero_stage}, "
                 f"{t.recompute} recompute{_trained(workload)}{_nodes(t.nodes)}")
    bound = f"(LP bound {s.lp_bound:.2f}, gap {s.gap:.2%})"
    sim = report.chosen.simulated
    if sim is not None:
        window = {None: "screened", True: "settled", False: "not settled"}[sim.settled]
        lines.append(f"  throughput {summary['samples_per_s']:.2f} samples/s simulated ({window}, "
                     f"{len(sim.step_times)} steps), {s.samples_per_s:.2f} analytic " + bound)
    else:
        lines.append(f"  throughput {s.samples_per_s:.2f} samples/s analytic, not simulated {bound}")
    lines.append(f"  cost      ${s.cost_per_hour:,.2f}/h, ${summary['cost_per_1k_samples']:.3f} per 1k samples")
    if report.restriction is not None:
        r = report.restriction
        free = r["unrestricted_samples_per_s"]
        share = summary["samples_per_s"] / free if free > 0 else math.inf
        lines.append(f"  restricted to what {r['framework']} launches: {r['rule']}; the unrestricted plan simulates "
                     f"{free:.2f} samples/s at ${r['unrestricted_cost_per_hour']:,.2f}/h, this one {share:.1%} of it")
    marginal = ", ".join(f"{k} +{v:.3f}" for k, v in report.marginal.items())
    lines.append(f"  bottleneck {s.bottleneck}" + (f"; one more GPU adds (samples/s): {marginal}" if marginal else ""))
    if report.baselines:
        lines.append("baselines (planned and simulated the same way, same budget):")
        for name, b in report.baselines.items():
            ratio = summary["samples_per_s"] / b.samples_per_s if b.samples_per_s > 0 else math.inf
            gpus = ", ".join(f"{n} {k}" for k, n in b.plan.gpus_in_use.items())
            beyond = "" if summary["baselines_within_fleet"][name] else ", more GPUs than this fleet has"
            lines.append(f"  {name:<16} {b.samples_per_s:8.2f} samples/s  ${b.solution.cost_per_hour:8.2f}/h  "
                         f"plan is {ratio:.2f}x  ({gpus}{beyond})")
    lines += [f"note: {note}" for note in report.notes]
    lines += summary_lines(summary["exports"], args.out, args.cluster, args.workload)
    if args.out:
        lines.append(f"plan -> {args.out}")
    return lines
