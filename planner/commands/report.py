"""`rlfleet report`: a self-contained HTML page about a plan."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from planner.commands.args import add_profile_arg, cost_model, emit, non_negative_seed, positive_int
from traces import load_cluster, load_plan, load_workload
from traces.io import atomic_write_text, check_target


def register(sub: Any) -> None:
    p = sub.add_parser("report", help="write an HTML report of a plan (tables, baselines, plots, exports)")
    p.add_argument("plan", help="plan JSON file (from rlfleet plan --out, or written by hand)")
    p.add_argument("--cluster", required=True, help="cluster YAML file")
    p.add_argument("--workload", required=True, help="workload YAML file")
    p.add_argument("--out", default="report", metavar="DIR", help="folder for report.html (default ./report)")
    p.add_argument("--steps", type=positive_int, default=8, help="trainer steps to simulate (default 8)")
    p.add_argument("--seed", type=non_negative_seed, default=0, help="simulation seed (default 0)")
    add_profile_arg(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from planner.report import render

    plan, cluster, workload = load_plan(args.plan), load_cluster(args.cluster), load_workload(args.workload)
    target = Path(args.out) / "report.html"
    check_target(target)  # a bad --out is one line now, not after the simulation and plots
    page = render(plan, cluster, workload, steps=args.steps, seed=args.seed, cost_model=cost_model(args))
    atomic_write_text(target, page)
    emit({"report": str(target), "bytes": len(page)}, args.json, [f"report -> {target} ({len(page) // 1024} KiB)"])
    return 0
