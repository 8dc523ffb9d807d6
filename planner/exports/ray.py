"""`rlfleet export --to ray`: the placement groups `rlfleet run` reserves, one per plan group.

The groups come from traces.placement.group_shapes, the function runtime/placement.py reserves
them with, so the export and the run cannot drift apart.
"""

from __future__ import annotations

from typing import Any

from traces import Plan
from traces.placement import STRATEGY, group_shapes


def placement_groups(plan: Plan, gpus: bool = True) -> list[dict[str, Any]]:
    """[{"role", "gpu_type", "actors", "bundles_per_actor", "strategy", "bundles"}] for ray.util.placement_group."""
    return [{"role": s.role, "gpu_type": s.gpu_type, "actors": s.actors, "bundles_per_actor": s.per_actor,
             "strategy": STRATEGY, "bundles": s.bundles(gpus)} for s in group_shapes(plan)]
