"""A plan in the formats other systems launch from: AReaL and verl configs, Ray placement, Slurm jobs.

`render` gives the text of one export; planner/exports/<target>.py builds each.
"""

from __future__ import annotations

import os
import re
from typing import Any

import yaml

from planner.exports import areal, ray, slurm, verl
from planner.exports.roles import host_names
from traces import Cluster, Plan, SpecError, Workload

TARGETS = ("areal", "verl", "ray", "slurm")


def data(target: str, plan: Plan, cluster: Cluster, workload: Workload, *, hosts: str | os.PathLike[str] | None = None,
         recipe: str | None = None) -> tuple[list[str], Any]:
    """(header lines, the export's data) of one target; SpecError when the target cannot express the plan."""
    names = host_names(cluster, hosts)
    if target == "areal":
        return areal.header(plan, cluster, names), areal.config(plan, cluster, workload, names)
    if target == "verl":
        return verl.header(plan, cluster, names), verl.spec(plan, cluster, workload, recipe)
    if target == "ray":
        head = ["Ray placement groups per plan group, as `rlfleet run` reserves them "
                "(ray.util.placement_group(bundles, strategy=strategy)); bundles ask rlfleet_node:<i>, the plan's "
                "node, where the cluster's Ray nodes declare it (ray start --resources)"]
        return head, {"placement_groups": ray.placement_groups(plan, cluster=cluster)}
    if target == "slurm":
        return [], slurm.script(plan, cluster, names, "rlfleet-" + re.sub(r"[^A-Za-z0-9._-]", "-", workload.name))
    raise SpecError(f"--to {target}: unknown export; use one of {', '.join(TARGETS)}")


def render(target: str, plan: Plan, cluster: Cluster, workload: Workload, **kw: Any) -> str:
    """The export as the text its system reads: YAML (header as comments), or the Slurm script."""
    header, body = data(target, plan, cluster, workload, **kw)
    if isinstance(body, str):
        return body
    comments = "".join(f"# {line}\n" for line in header)
    return comments + yaml.safe_dump(body, sort_keys=False, default_flow_style=False, width=120)


def summary(plan: Plan, cluster: Cluster, workload: Workload) -> dict[str, Any]:
    """AReaL's per-engine backends and verl's spec for this plan, or the one-line reason it needs a re-plan."""
    out: dict[str, Any] = {}
    for target in ("areal", "verl"):
        try:
            _, body = data(target, plan, cluster, workload)
        except SpecError as exc:
            out[target] = {"error": str(exc)}
            continue
        out[target] = ({"rollout.backend": body["rollout"]["backend"], "actor.backend": body["actor"]["backend"]}
                       if target == "areal" else body)
    return out


def summary_lines(exports: dict[str, Any], plan_file: str | None, cluster_file: str, workload_file: str) -> list[str]:
    """Lines that parse as they are: AReaL's backend fields and verl's overrides, then the export command."""
    lines = []
    areal_ = exports["areal"]
    if "error" in areal_:
        lines.append(f"AReaL: {areal_['error']}")
    else:
        lines.append("AReaL: " + " ".join(f"{k}={v}" for k, v in areal_.items()))
    verl_ = exports["verl"]
    if "error" in verl_:
        lines.append(f"verl: {verl_['error']}")
    else:
        lines.append(f"verl: {verl_['config_dir']}/{verl_['config_name']} " + " ".join(verl_["overrides"]))
    tail = "" if plan_file else "  (write the plan with --out PLAN.json)"
    lines.append(f"export: rlfleet export {plan_file or 'PLAN.json'} --cluster {cluster_file} "
                 f"--workload {workload_file} --to {'|'.join(TARGETS)}{tail}")
    return lines
