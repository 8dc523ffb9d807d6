"""`rlfleet catalog`: the shipped GPU types, model presets and examples."""

from __future__ import annotations

import argparse
from typing import Any

from planner.commands.args import emit
from traces import example_clusters, example_workloads, get_gpu, get_model, gpu_names, model_names


def register(sub: Any) -> None:
    p = sub.add_parser("catalog", help="list GPU types, model presets and shipped examples")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    gpus = [get_gpu(n) for n in gpu_names()]
    models = [get_model(n) for n in model_names()]
    obj = {
        "gpus": [g.model_dump(mode="json") for g in gpus],
        "models": [{**m.model_dump(mode="json"), "params": m.params, "active_params": m.active_params,
                    "kv_bytes_per_token": m.kv_bytes_per_token} for m in models],
        "example_clusters": example_clusters(),
        "example_workloads": example_workloads(),
    }
    lines = ["GPU types (bf16 dense peak, HBM, HBM bandwidth, intra-node link, default $/GPU-hour):"]
    for g in gpus:
        alias = f"  (aliases: {', '.join(g.aliases)})" if g.aliases else ""
        lines.append(
            f"  {g.name:<9} {g.bf16_tflops:>6.0f} TFLOP/s {g.hbm_gb:>5.0f} GB {g.hbm_tb_per_s:>5.2f} TB/s "
            f"{g.link_kind} {g.link_gb_per_s:.0f} GB/s  ${g.price_per_gpu_hour:.2f}/h{alias}"
        )
    lines.append("Model presets (parameters, KV bytes per token; MoE: parameters a token passes through):")
    for m in models:
        moe = "" if m.moe is None else f"  MoE, {m.active_params / 1e9:.2f} B active"
        lines.append(f"  {m.name:<14} {m.params / 1e9:>7.2f} B  {m.kv_bytes_per_token / 1024:>6.0f} KiB/token{moe}")
    lines.append(f"Example clusters:  {', '.join(example_clusters())}")
    lines.append(f"Example workloads: {', '.join(example_workloads())}")
    lines.append("Prices are editable defaults (see traces/data/gpus.yaml for sources and dates).")
    emit(obj, args.json, lines)
    return 0
