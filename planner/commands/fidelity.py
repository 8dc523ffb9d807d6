"""`rlfleet fidelity RUN_DIR`: predicted vs measured throughput of a recorded run, and per plan group and
phase where the run recorded its placement (sim.fidelity)."""

from __future__ import annotations

import argparse
from typing import Any

from planner.commands.args import add_profile_arg, cost_model, emit, non_negative_seed
from sim.fidelity import Fidelity, predict_run
from traces.records import read_run


def register(sub: Any) -> None:
    p = sub.add_parser("fidelity", help="simulate a recorded run (rlfleet run --out DIR) and compare with it")
    p.add_argument("run_dir", metavar="RUN_DIR", help="the --out folder of an rlfleet run")
    add_profile_arg(p)
    p.add_argument("--seed", type=non_negative_seed, default=0, help="simulation seed (default 0)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    record = read_run(args.run_dir)
    fid = predict_run(record, cost_model(args), seed=args.seed)
    plan = record.plan
    groups = ", ".join(f"{g.instances}x {g.gpu_type} tp{g.tp}" for g in plan.rollout)
    head = (f"{args.run_dir}: {record.workload.model.name}, {plan.mode} (staleness {plan.staleness}), "
            f"rollout {groups}, trainer {plan.trainer.gpu_type} dp{plan.trainer.dp}")
    emit(fid.summary(), args.json, [head, *lines(fid)])
    return 0


def lines(fid: Fidelity) -> list[str]:
    """The human report, shared with `rlfleet run`."""
    sources = ", ".join(f"{stage} {src}" for stage, src in fid.sources.items())
    return [
        f"  predicted {fid.predicted_samples_per_s:,.1f} samples/s (simulated, {fid.steps} steps)",
        f"  measured  {fid.measured_samples_per_s:,.1f} samples/s (steady state)",
        f"  error     {fid.error:+.1%}  [costs from: {sources}]",
        *group_lines(fid),
    ]


def group_lines(fid: Fidelity) -> list[str]:
    """Per plan group and phase: predicted vs measured busy seconds per step (a run with a placement record)."""
    if not fid.groups:
        return []
    out = ["  per group and phase, busy s/step    predicted   measured"]
    for group, phases in fid.groups.items():
        for phase, (predicted, measured) in phases.items():
            ratio = f"{predicted / measured:6.2f}x" if measured > 0 else "      -"
            out.append(f"    {group:<9} {phase:<12} {predicted:>20.4f} {measured:>10.4f} {ratio}")
    return out
