"""`rlfleet calibrate LOG...`: fit the cost model to a run's logged phases and write it as a profile.

LOG is an `rlfleet run --out` folder (its timeline gives the phases; its plan, workload and cluster
come with it) or verl-style per-step metrics files (JSONL or CSV with `timing_s/gen`,
`timing_s/old_log_prob`, `timing_s/update_actor`, `timing_s/step`, ...), which need `--cluster`,
`--workload` and `--plan`. The written CSV is a cost table: `simulate`, `plan`, `report` and
`fidelity` take it with `--profile`.
"""

from __future__ import annotations

import argparse
import datetime
from pathlib import Path
from typing import Any

from planner.commands.args import emit, non_negative_seed
from sim.breakdown import mean_phases
from sim.calibrate import calibrate, profile_rows
from traces import SpecError, load_cluster, load_plan, load_workload
from traces.io import atomic_write_text
from traces.phases import PHASES, read_phase_log
from traces.records import read_run, warm_steps


def register(sub: Any) -> None:
    p = sub.add_parser("calibrate", help="fit the cost model to a run's logged phases; write a --profile CSV")
    p.add_argument("logs", nargs="+", metavar="LOG",
                   help="an rlfleet run folder, or verl-style metrics files (.jsonl/.csv with timing_s/* keys)")
    p.add_argument("--cluster", help="cluster YAML of the run (a run folder brings its own)")
    p.add_argument("--workload", help="workload YAML of the run")
    p.add_argument("--plan", help="plan JSON of the run")
    p.add_argument("--out", default="calibrated-profile.csv", help="cost-table CSV to write (default %(default)s)")
    p.add_argument("--seed", type=non_negative_seed, default=0, help="simulation seed (default 0)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=run)


def _inputs(args: argparse.Namespace) -> tuple[Any, Any, Any, dict[str, float], int]:
    folders = [Path(x) for x in args.logs if Path(x).is_dir()]
    if folders:
        if len(args.logs) > 1:
            raise SpecError("give one run folder, or one or more metrics files (not both)")
        record = read_run(folders[0])
        cluster = load_cluster(args.cluster) if args.cluster else record.cluster
        workload = load_workload(args.workload) if args.workload else record.workload
        plan = load_plan(args.plan) if args.plan else record.plan
        return cluster, workload, plan, mean_phases(record.timeline, plan.staleness), record.steps
    missing = [f"--{n}" for n in ("cluster", "workload", "plan") if getattr(args, n) is None]
    if missing:
        raise SpecError(f"metrics files need the run's {', '.join(missing)} (a run folder brings them)")
    plan = load_plan(args.plan)
    steps = [row for log in args.logs for row in read_phase_log(log)]
    tail = steps[warm_steps(plan.staleness, len(steps)):]
    measured = {p: sum(s.get(p, 0.0) for s in tail) / len(tail) for p in PHASES if any(p in s for s in tail)}
    return load_cluster(args.cluster), load_workload(args.workload), plan, measured, len(steps)


def run(args: argparse.Namespace) -> int:
    cluster, workload, plan, measured, steps = _inputs(args)
    cal = calibrate(cluster, workload, plan, measured, seed=args.seed)
    stamp = datetime.date.today().isoformat()
    source = f"calibrated: rlfleet calibrate {' '.join(Path(x).name for x in args.logs)} ({stamp})"
    rows = profile_rows(cal, cluster, workload, plan, source)
    atomic_write_text(args.out, rows.to_csv(index=False))
    fitted = {f: getattr(cal.efficiency, f) for f in cal.fields}
    obj = {"measured": cal.measured, "predicted_before": {p: cal.before[p] for p in cal.measured},
           "predicted": {p: cal.predicted[p] for p in cal.measured}, "errors": cal.errors(), "fitted": fitted,
           "steps_read": steps, "profile": args.out, "rows": len(rows)}
    lines = [f"{steps} steps read; phases in mean seconds per step (steady state):",
             f"  {'phase':<8} {'measured':>9} {'before':>9} {'after':>9} {'error':>7}"]
    for p, v in cal.measured.items():
        lines.append(f"  {p:<8} {v:9.3f} {cal.before[p]:9.3f} {cal.predicted[p]:9.3f} {cal.errors()[p]:+7.1%}")
    lines.append("fitted: " + ", ".join(f"{f} {v:.4g}" for f, v in fitted.items()))
    lines.append(f"profile -> {args.out} ({len(rows)} rows; use it with --profile)")
    emit(obj, args.json, lines)
    return 0
