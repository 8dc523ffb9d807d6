"""Ray placement of a plan: one placement group per plan group, pinned to its GPU type and the plan's nodes.

The groups' shapes (bundles, their resources, the strategy, each bundle's node) come from
traces.placement, the same function `rlfleet export --to ray` prints; this module reserves them on
a running Ray cluster. Bundles are pinned to the plan's nodes where the Ray cluster names its
nodes (`rlfleet_node:<index>` resources, as `rlfleet run --local` declares on its fake nodes); on a
cluster that names none, to the GPU type only (`Placement.pinned` says which). A colocated plan's
engines share the trainer's bundles, each of the two actors on a bundle asking half its device.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from traces import Cluster, Plan, SpecError
from traces.placement import NODE_RESOURCE, STRATEGY, TYPE_RESOURCE, TYPE_SHARE, bundle, group_shapes

__all__ = ["NODE_RESOURCE", "TYPE_RESOURCE", "TYPE_SHARE", "Group", "Placement", "bundle", "place"]

COLOCATED_SHARE = 0.5  # a colocated bundle holds one engine and one trainer rank: half a device each


@dataclass(frozen=True)
class Group:
    """One plan group's reservation: `actors` actors, each on `per_actor` consecutive bundles of
    `placement_group` from `offset` on (a colocated engine group's are the trainer's)."""

    role: str  # "rollout" or "train"
    gpu_type: str
    actors: int
    per_actor: int
    placement_group: Any  # ray.util.placement_group.PlacementGroup
    nodes: tuple[int | None, ...] = ()  # the plan's node of each actor (None: the plan names none)
    offset: int = 0
    share: float = 1.0  # of its bundle's device each actor asks

    def actor_options(self, index: int) -> dict[str, Any]:
        """`.options(**...)` for actor `index` of this group: its first bundle, its device."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if not 0 <= index < self.actors:
            raise IndexError(f"{self.role} group has {self.actors} actors, no index {index}")
        strategy = PlacementGroupSchedulingStrategy(placement_group=self.placement_group,
                                                    placement_group_bundle_index=self.offset + index * self.per_actor)
        device = "num_gpus" if "GPU" in self.placement_group.bundle_specs[0] else "num_cpus"
        return {"scheduling_strategy": strategy, device: self.share}

    def node(self, index: int) -> int | None:
        return self.nodes[index] if self.nodes else None


@dataclass(frozen=True)
class Placement:
    groups: tuple[Group, ...]  # the plan's rollout groups in order, then the trainer
    pinned: bool  # bundles pinned to the plan's nodes (the cluster names them), not only to the type

    def __iter__(self) -> Iterator[Group]:
        return iter(self.groups)

    @property
    def rollout(self) -> tuple[Group, ...]:
        return tuple(g for g in self.groups if g.role == "rollout")

    @property
    def trainer(self) -> Group:
        return next(g for g in self.groups if g.role == "train")

    def remove(self) -> None:
        import ray

        for pg in {id(g.placement_group): g.placement_group for g in self.groups}.values():
            ray.util.remove_placement_group(pg)


def place(plan: Plan, *, gpus: bool, cluster: Cluster | None = None, timeout_s: float = 60.0) -> Placement:
    """Reserve every plan group on a running Ray cluster; SpecError if the cluster cannot hold it."""
    import ray
    from ray.util.placement_group import placement_group

    shapes = group_shapes(plan, cluster)
    pinned = _pinned(shapes, ray.cluster_resources())
    pgs: list[Any] = []
    try:
        # the trainer first: a colocated plan's engines sit on its bundles
        train = shapes[-1]
        t_pg = _reserve(placement_group(train.bundles(gpus, pinned), strategy=STRATEGY), train.role, train.gpu_type,
                        train.actors, timeout_s)
        pgs.append(t_pg)
        share = COLOCATED_SHARE if plan.mode == "colocated" else 1.0
        groups = []
        for shape in shapes[:-1]:
            if shape.shared:
                pg = t_pg
            else:
                pg = _reserve(placement_group(shape.bundles(gpus, pinned), strategy=STRATEGY), shape.role,
                              shape.gpu_type, shape.actors * shape.per_actor, timeout_s)
                pgs.append(pg)
            groups.append(Group(shape.role, shape.gpu_type, shape.actors, shape.per_actor, pg, shape.actor_nodes(),
                                shape.offset, share))
        groups.append(Group(train.role, train.gpu_type, train.actors, 1, t_pg, train.actor_nodes(), 0, share))
    except BaseException:
        for pg in pgs:
            ray.util.remove_placement_group(pg)
        raise
    return Placement(tuple(groups), pinned)


def _pinned(shapes: tuple[Any, ...], resources: dict[str, float]) -> bool:
    """Pin to nodes if the plan names nodes and the cluster names its nodes; SpecError if it names
    others than the plan's (a plan for another cluster, or a node missing)."""
    wanted = sorted({n for s in shapes for n in s.nodes})
    named = any(k.startswith(NODE_RESOURCE.format("")) for k in resources)
    if not wanted or not named:
        return False
    missing = [n for n in wanted if NODE_RESOURCE.format(n) not in resources]
    if missing:
        raise SpecError(f"the plan places work on node {missing[0]}, but the Ray cluster has no node named "
                        f"{NODE_RESOURCE.format(missing[0])}; start that node, or run a plan for this cluster")
    return True


def _reserve(pg: Any, role: str, gpu_type: str, devices: int, timeout_s: float) -> Any:
    import ray

    ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
    if not ready:
        ray.util.remove_placement_group(pg)
        have = ray.cluster_resources().get(TYPE_RESOURCE.format(gpu_type), 0)
        raise SpecError(f"the Ray cluster cannot hold the {role} group ({devices} {gpu_type} devices; "
                        f"{TYPE_RESOURCE.format(gpu_type)} there: {have:g}, with the other groups placed first); "
                        "start nodes with that resource or change the plan")
    return pg
