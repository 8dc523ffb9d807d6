"""`rlfleet validate`: check cluster, workload and plan files and summarise them."""

from __future__ import annotations

import argparse
from typing import Any

from planner.commands.args import emit
from traces import SpecError, load_cluster, load_plan, load_workload
from traces.plan_check import check_plan


def register(sub: Any) -> None:
    p = sub.add_parser("validate", help="check cluster / workload / plan files and summarise them")
    p.add_argument("--cluster", help="cluster YAML file")
    p.add_argument("--workload", help="workload YAML file")
    p.add_argument("--plan", help="plan JSON file")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if not (args.cluster or args.workload or args.plan):
        raise SpecError("nothing to validate; give --cluster, --workload and/or --plan")
    obj: dict[str, Any] = {}
    lines: list[str] = []
    c = load_cluster(args.cluster) if args.cluster else None
    if c is not None:
        obj["cluster"] = {"name": c.name, "gpus": c.gpu_counts, "total_gpus": c.total_gpus,
                          "own_gpu_types": [g.name for g in c.gpus]}
        counts = ", ".join(f"{n} {t}" for t, n in c.gpu_counts.items())
        own = f"; own GPU types: {', '.join(g.name for g in c.gpus)}" if c.gpus else ""
        lines.append(f"cluster {c.name}: {c.total_gpus} GPUs ({counts}){own}")
    if args.workload:
        w = load_workload(args.workload)
        obj["workload"] = {"name": w.name, "model": w.model.name, "samples_per_step": w.samples_per_step,
                           "mean_prompt": w.prompt_len.expected(), "mean_response": w.response_len.expected()}
        lines.append(
            f"workload {w.name}: {w.algorithm} on {w.model.name}, {w.samples_per_step} samples/step, "
            f"mean prompt {w.prompt_len.expected():.0f} + response {w.response_len.expected():.0f} tokens "
            f"(max {w.response_len.max}), mode {w.mode}, staleness {w.staleness}"
        )
    if args.plan:
        p = load_plan(args.plan)
        if c is not None:  # a type neither the catalog nor the cluster knows: one line naming it
            for gpu_type in p.gpus_in_use:
                try:
                    c.resolve(gpu_type)
                except SpecError as exc:
                    raise SpecError(f"{args.plan}: {exc}") from None
        if c is not None:  # the whole plan against its cluster (and workload): every problem at once
            check_plan(c, w if args.workload else None, p)
        obj["plan"] = {"mode": p.mode, "gpus": p.gpus_by_type, "total_gpus": p.total_gpus}
        lines.append(f"plan: {p.mode}, {p.total_gpus} GPUs, {p.gpus_by_type}")
    obj["ok"] = True
    emit(obj, args.json, [*lines, "ok"])
    return 0
