"""`rlfleet export --to ray`: the placement groups `rlfleet run` reserves, one per plan group.

The groups come from traces.placement.group_shapes, the function runtime/placement.py reserves
them with, so the export and the run cannot drift apart.
"""

from __future__ import annotations

from typing import Any

from traces import Cluster, Plan
from traces.placement import STRATEGY, group_shapes


def placement_groups(plan: Plan, gpus: bool = True, cluster: Cluster | None = None) -> list[dict[str, Any]]:
    """[{"role", "gpu_type", "actors", "bundles_per_actor", "strategy", "bundles"}] for ray.util.placement_group
    (with `cluster`, each bundle pinned to the plan's node; a colocated plan's engine groups share the trainer's
    bundles and list none of their own)."""
    return [{"role": s.role, "gpu_type": s.gpu_type, "actors": s.actors, "bundles_per_actor": s.per_actor,
             "strategy": STRATEGY, "bundles": s.bundles(gpus)} for s in group_shapes(plan, cluster)]
