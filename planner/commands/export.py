"""`rlfleet export`: a plan in the format AReaL, verl, Ray or Slurm launches from."""

from __future__ import annotations

import argparse
from typing import Any

from traces import load_cluster, load_plan, load_workload
from traces.io import atomic_write_text


def register(sub: Any) -> None:
    from planner.exports import TARGETS
    from planner.exports.verl import RECIPES

    p = sub.add_parser("export", help="write a plan as an AReaL or verl config, Ray placement groups or a Slurm job")
    p.add_argument("plan", metavar="PLAN", help="plan JSON file (from `rlfleet plan --out`)")
    p.add_argument("--cluster", required=True, help="cluster YAML file the plan was made for")
    p.add_argument("--workload", required=True, help="workload YAML file (batch, group size, lengths)")
    p.add_argument("--to", required=True, choices=TARGETS, help="areal: GRPOConfig YAML; verl: Hydra config and "
                   "overrides; ray: placement groups; slurm: heterogeneous-job script")
    p.add_argument("--recipe", choices=tuple(RECIPES), help="verl only: fully_async (default for separate GPUs), "
                   "one_step_off (staleness 1) or ppo (colocated)")
    p.add_argument("--hosts", metavar="FILE", help="host names, one a line in the cluster file's node order "
                   "(default node0, node1, ...): the node lists of areal and slurm")
    p.add_argument("--out", metavar="FILE", help="write the export here instead of printing it")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from planner.exports import render

    text = render(args.to, load_plan(args.plan), load_cluster(args.cluster), load_workload(args.workload),
                  hosts=args.hosts, recipe=args.recipe)
    if args.out:
        atomic_write_text(args.out, text)
    else:
        print(text, end="")
    return 0
