"""`rlfleet simulate`: run one plan through the discrete-event simulator."""

from __future__ import annotations

import argparse
from typing import Any

from planner.commands.args import add_profile_arg, cost_model, emit, non_negative_seed, positive_int
from sim import simulate
from traces import load_cluster, load_plan, load_workload
from traces.io import atomic_write_bytes, atomic_write_text, check_target
from traces.records import SETTLE_MIN_PERIODS, SETTLE_TOLERANCE, settle_cap
from traces.staleness import lag_bound


def register(sub: Any) -> None:
    p = sub.add_parser("simulate", help="simulate a plan on a cluster for a workload")
    p.add_argument("--cluster", required=True, help="cluster YAML file")
    p.add_argument("--workload", required=True, help="workload YAML file")
    p.add_argument("--plan", required=True, help="plan JSON file")
    p.add_argument("--steps", type=positive_int, default=None,
                   help="trainer steps to simulate (default 10; with --until-settled the cap, default "
                        "warm-up + about 48 steps, traces.records.settle_cap)")
    p.add_argument("--until-settled", action="store_true",
                   help=f"simulate until the steady rate settles (moves < {SETTLE_TOLERANCE * 100:g}%% over a period, "
                        f"after {SETTLE_MIN_PERIODS} periods): slow steps can recur at a longer period than a "
                        "short run sees")
    p.add_argument("--seed", type=non_negative_seed, default=0, help="random seed for response lengths (default 0)")
    p.add_argument("--token-level", action="store_true", help="one event per decode iteration (reference mode)")
    p.add_argument("--timeline", metavar="CSV", help="write the timeline (one row per interval) to this CSV")
    p.add_argument("--gantt", metavar="PNG", help="write a Gantt chart of the timeline to this PNG")
    p.add_argument("--breakdown", action="store_true",
                   help="print the trainer step's phases (wait/gen, switch, logprob, train, sync) as verl logs them")
    add_profile_arg(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    cluster, workload, plan = load_cluster(args.cluster), load_workload(args.workload), load_plan(args.plan)
    for out in (args.timeline, args.gantt):
        if out:  # a bad output path is one line now, not after the simulation
            check_target(out)
    steps = args.steps or (settle_cap(plan.staleness) if args.until_settled else 10)
    r = simulate(cluster, workload, plan, cost_model(args), steps=steps, seed=args.seed,
                 token_level=args.token_level, until_settled=args.until_settled)
    ran = len(r.step_times)
    if args.timeline:
        atomic_write_text(args.timeline, r.timeline.to_csv(index=False))
    if args.gantt:
        import io

        from sim.plots import gantt

        buf = io.BytesIO()
        gantt(r).savefig(buf, format="png", dpi=110)
        atomic_write_bytes(args.gantt, buf.getvalue())
    util = ", ".join(f"{k} {v:.0%}" for k, v in r.utilization.items())
    summary = r.summary()
    settling: list[str] = []
    if args.until_settled:
        summary["steps"], summary["settled"] = ran, bool(r.settled)
        settling = [f"  settled     after {ran} steps" if r.settled else
                    f"  settled     no: the rate still moved more than {SETTLE_TOLERANCE:.0%} per period at the cap "
                    f"of {steps} steps (raise --steps)"]
    dropped: list[str] = []
    if workload.dynamic_sampling is not None:  # generated and filtered out: the rollout work it cost
        summary["dropped_samples"] = r.dropped
        dropped = [f"  dropped     {r.dropped:,} samples by dynamic sampling "
                   f"({(r.trained_samples + r.dropped) / max(r.trained_samples, 1):.2f} generated per trained)"]
    phases: list[str] = []
    if args.breakdown:
        from sim.breakdown import mean_phases
        from traces.phases import VERL_KEYS

        summary["phases"] = mean_phases(r.timeline, plan.staleness)
        phases = ["  phases      steady-state mean seconds per step (verl's metric):"] + [
            f"    {name:<8} {value:8.3f}" + (f"  ({' + '.join(VERL_KEYS[name])})" if name in VERL_KEYS else "")
            for name, value in summary["phases"].items()]
    emit(summary, args.json, [
        f"{plan.mode} plan, {plan.total_gpus} GPUs, {ran} steps of {workload.samples_per_step} samples:",
        f"  throughput  {r.samples_per_s:,.2f} samples/s, {r.tokens_per_s:,.0f} tokens/s",
        f"  step time   mean {r.mean_step_s:.2f} s",
        f"  staleness   max {r.max_staleness} (bound {plan.staleness}"
        + (f" of a batch: lag at most {lag_bound(plan.staleness)})" if plan.staleness % 1 else ")"),
        *dropped,
        *settling,
        f"  busy        {util}",
        f"  cost        ${r.cost_per_hour:,.2f}/h, ${r.cost_per_1k_samples:.3f} per 1k samples",
        *phases,
        *( [f"  timeline -> {args.timeline}"] if args.timeline else []),
        *( [f"  gantt    -> {args.gantt}"] if args.gantt else []),
    ])
    return 0
