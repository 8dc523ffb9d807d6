"""Who ran where: every actor's Ray node, that node's GPU-type label and plan node index, and each
plan group's actors, as found from the running actors themselves (not from what was asked).

`placement.json` and `phases.json` in the run folder (their formats: traces.records).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from runtime.placement import Placement
from traces import Plan
from traces.io import atomic_write_text
from traces.placement import NODE_LABEL, NODE_RESOURCE, TYPE_LABEL, TYPE_RESOURCE
from traces.records import PHASES_FILE, PLACEMENT_FILE, TRAINER_KEY, group_phases, read_metrics, rollout_key


def node_facts() -> dict[str, dict[str, Any]]:
    """Ray node id -> its GPU type and plan node index (labels first, else the resources), and its labels."""
    import ray

    out = {}
    for node in ray.nodes():
        labels = dict(node.get("Labels") or {})
        resources = node.get("Resources") or {}
        types = [k.split(":", 1)[1] for k in resources if k.startswith(TYPE_RESOURCE.format(""))]
        indices = [k.split(":", 1)[1] for k in resources if k.startswith(NODE_RESOURCE.format(""))]
        gpu_type = labels.get(TYPE_LABEL) or (types[0] if len(types) == 1 else None)
        index = labels.get(NODE_LABEL) or (indices[0] if len(indices) == 1 else None)
        out[node["NodeID"]] = {"gpu_type": gpu_type, "index": int(index) if index is not None else None,
                               "labels": {k: v for k, v in labels.items() if k.startswith("rlfleet.io/")}}
    return out


def describe_placement(plan: Plan, placement: Placement, engines: list[Any], ranks: list[Any], engine_kind: str,
                       executor: str) -> dict[str, Any]:
    """The placement record of a started fleet: `engines` in slot order (group by group), trainer `ranks`."""
    import ray

    facts = node_facts()
    where = ray.get([a.node_id.remote() for a in [*engines, *ranks]])
    actors, groups, slot = [], [], 0
    for gi, (g, group) in enumerate(zip(plan.rollout, placement.rollout, strict=True)):
        names = [f"engine{slot + i}" for i in range(group.actors)]
        groups.append({"group": rollout_key(gi), "role": "rollout", "gpu_type": g.gpu_type, "tp": g.tp,
                       "engines": names, "plan_nodes": list(g.nodes)})
        actors += [_actor(name, rollout_key(gi), "rollout", g.gpu_type, group.node(i), where[slot + i], facts)
                   for i, name in enumerate(names)]
        slot += group.actors
    t = plan.trainer
    names = [f"trainer{r}" for r in range(len(ranks))]
    groups.append({"group": TRAINER_KEY, "role": "train", "gpu_type": t.gpu_type, "dp": t.dp, "tp": t.tp,
                   "pp": t.pp, "ranks": names, "plan_nodes": list(t.nodes)})
    actors += [_actor(name, TRAINER_KEY, "train", t.gpu_type, placement.trainer.node(r), where[slot + r], facts)
               for r, name in enumerate(names)]
    return {"mode": plan.mode, "staleness": plan.staleness, "engine": engine_kind, "executor": executor,
            "pinned_to_nodes": placement.pinned, "groups": groups, "actors": actors}


def _actor(name: str, group: str, role: str, gpu_type: str, plan_node: int | None, ray_node: str,
           facts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    fact = facts.get(ray_node, {"gpu_type": None, "index": None, "labels": {}})
    return {"name": name, "group": group, "role": role, "gpu_type": gpu_type, "plan_node": plan_node,
            "ray_node": ray_node, "node_gpu_type": fact["gpu_type"], "node_index": fact["index"],
            "node_labels": fact["labels"]}


def write_placement(out: Path, record: dict[str, Any]) -> None:
    """placement.json, and phases.json from the run's timeline (per plan group and phase)."""
    import pandas as pd

    from traces.records import TIMELINE_FILE

    atomic_write_text(out / PLACEMENT_FILE, json.dumps(record, indent=1) + "\n")
    timeline = pd.read_csv(out / TIMELINE_FILE) if (out / TIMELINE_FILE).is_file() else pd.DataFrame()
    phases = group_phases(timeline, {a["name"]: a["group"] for a in record["actors"]})
    steps = len(read_metrics(out))
    atomic_write_text(out / PHASES_FILE, json.dumps({"steps": steps, "groups": phases}, indent=1) + "\n")
