"""Ray placement of a plan: one placement group per plan group, pinned to its GPU type.

Every bundle asks for one device and a sliver of the custom resource `accelerator_type:<TYPE>`
(Ray sets it on GPU nodes; fake CPU nodes in tests declare it), so a group can only land on nodes
of its type. On GPU clusters the device is {"GPU": 1}; on CPU-only machines {"CPU": 1}. An engine
of TP t takes t consecutive bundles (its actor sits on the first; vLLM spawns the rest).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from traces import Plan, SpecError

TYPE_RESOURCE = "accelerator_type:{}"
TYPE_SHARE = 0.001  # any positive amount pins the bundle to a node that has the type at all


def bundle(gpu_type: str, gpus: bool) -> dict[str, float]:
    return {"GPU" if gpus else "CPU": 1.0, TYPE_RESOURCE.format(gpu_type): TYPE_SHARE}


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

    shape: list[tuple[str, str, int, int]] = [("rollout", g.gpu_type, g.instances, g.tp) for g in plan.rollout]
    t = plan.trainer
    shape.append(("train", t.gpu_type, t.gpus, 1))  # one actor per trainer rank
    groups = []
    for role, gpu_type, actors, per_actor in shape:
        pg = placement_group([bundle(gpu_type, gpus)] * (actors * per_actor), strategy="PACK")
        ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
        if not ready:
            have = ray.cluster_resources().get(TYPE_RESOURCE.format(gpu_type), 0)
            raise SpecError(f"the Ray cluster cannot hold the {role} group ({actors * per_actor} {gpu_type} "
                            f"devices): it has {int(have)} nodes' worth of {TYPE_RESOURCE.format(gpu_type)}; "
                            "start nodes with that resource or change the plan")
        groups.append(Group(role, gpu_type, actors, per_actor, pg))
    return groups
