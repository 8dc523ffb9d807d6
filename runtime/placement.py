"""Ray placement of a plan: one placement group per plan group, pinned to its GPU type.

The groups' shapes (bundles, their resources, the strategy) come from traces.placement, the same
function `rlfleet export --to ray` prints; this module reserves them on a running Ray cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from traces import Plan, SpecError
from traces.placement import STRATEGY, TYPE_RESOURCE, TYPE_SHARE, bundle, group_shapes

__all__ = ["TYPE_RESOURCE", "TYPE_SHARE", "Group", "bundle", "place"]


@dataclass(frozen=True)
class Group:
    """One plan group's reservation: `actors` actors, each on `per_actor` consecutive bundles."""

    role: str  # "rollout" or "train"
    gpu_type: str
    actors: int
    per_actor: int
    placement_group: Any  # ray.util.placement_group.PlacementGroup

    def actor_options(self, index: int) -> dict[str, Any]:
        """`.options(**...)` for actor `index` of this group: its first bundle, its device."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if not 0 <= index < self.actors:
            raise IndexError(f"{self.role} group has {self.actors} actors, no index {index}")
        strategy = PlacementGroupSchedulingStrategy(placement_group=self.placement_group,
                                                    placement_group_bundle_index=index * self.per_actor)
        device = "num_gpus" if "GPU" in self.placement_group.bundle_specs[0] else "num_cpus"
        return {"scheduling_strategy": strategy, device: 1}


def place(plan: Plan, *, gpus: bool, timeout_s: float = 60.0) -> list[Group]:
    """Reserve every plan group on a running Ray cluster; SpecError if the cluster cannot hold it."""
    import ray
    from ray.util.placement_group import placement_group

    groups = []
    for shape in group_shapes(plan):
        role, gpu_type, actors, per_actor = shape.role, shape.gpu_type, shape.actors, shape.per_actor
        pg = placement_group(shape.bundles(gpus), strategy=STRATEGY)
        ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
        if not ready:
            have = ray.cluster_resources().get(TYPE_RESOURCE.format(gpu_type), 0)
            raise SpecError(f"the Ray cluster cannot hold the {role} group ({actors * per_actor} {gpu_type} "
                            f"devices): it has {int(have)} nodes' worth of {TYPE_RESOURCE.format(gpu_type)}; "
                            "start nodes with that resource or change the plan")
        groups.append(Group(role, gpu_type, actors, per_actor, pg))
    return groups
