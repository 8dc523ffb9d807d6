"""The shape of a plan's Ray reservation: which placement groups, how many bundles, what each asks.

Pure data (no ray import), so `rlfleet export --to ray` and `rlfleet run` (runtime/placement.py)
build the same groups from one function. Every bundle asks for one device and a sliver of the
custom resource `accelerator_type:<TYPE>` (Ray sets it on GPU nodes; fake CPU nodes in tests
declare it), so a group can only land on nodes of its type. An engine of TP t takes t consecutive
bundles (its actor sits on the first; vLLM spawns the rest); the trainer takes one bundle per rank.

Nodes: given the cluster, each bundle also carries the plan's node index for it (the plan lists a
group's nodes; its bundles fill them in order, `gpus_per_node` to a node, an engine's TP bundles on
one node, as planner.placement assigned them). A Ray cluster that names its nodes declares
`rlfleet_node:<index>` on each (`rlfleet run --local` does on its fake nodes; on a real cluster,
`ray start --resources`), and a bundle pinned to a node asks a sliver of it.

Colocated plans: the engines share the trainer's devices, so their groups reserve no bundles of
their own (`shared`); their actors sit on the trainer's bundles, engine k on bundles k*tp onward.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from traces.cluster import Cluster
from traces.errors import SpecError
from traces.plan import Plan

TYPE_RESOURCE = "accelerator_type:{}"
NODE_RESOURCE = "rlfleet_node:{}"  # the plan's node index of a Ray node, where the cluster names it
NODE_LABEL, TYPE_LABEL = "rlfleet.io/node", "rlfleet.io/gpu-type"  # the same, as Ray node labels
TYPE_SHARE = 0.001  # any positive amount pins the bundle to a node that has the type at all
STRATEGY = "PACK"  # fill a node before the next: an engine's TP bundles share a node where they fit


def bundle(gpu_type: str, gpus: bool, node: int | None = None) -> dict[str, float]:
    """One device ({"GPU": 1} on GPU clusters, {"CPU": 1} on CPU-only machines) pinned to its type,
    and to the plan's node `node` if given."""
    out = {"GPU" if gpus else "CPU": 1.0, TYPE_RESOURCE.format(gpu_type): TYPE_SHARE}
    if node is not None:
        out[NODE_RESOURCE.format(node)] = TYPE_SHARE
    return out


@dataclass(frozen=True)
class GroupShape:
    """One plan group's reservation: `actors` actors, each on `per_actor` consecutive bundles.

    `nodes`: the plan's node of each bundle (empty: the plan names none, any node of the type);
    `shared`: a colocated rollout group, whose actors sit on the trainer's bundles from `offset` on."""

    role: Literal["rollout", "train"]
    gpu_type: str
    actors: int
    per_actor: int
    nodes: tuple[int, ...] = ()
    shared: bool = False
    offset: int = 0

    def bundles(self, gpus: bool, pin_nodes: bool = True) -> list[dict[str, float]]:
        if self.shared:
            return []
        n = self.actors * self.per_actor
        nodes: Sequence[int | None] = self.nodes if (pin_nodes and self.nodes) else [None] * n
        return [bundle(self.gpu_type, gpus, node) for node in nodes]

    def actor_nodes(self) -> tuple[int | None, ...]:
        """The plan's node of each actor (its first bundle's), None where the plan names none."""
        if not self.nodes:
            return (None,) * self.actors
        return tuple(self.nodes[i * self.per_actor] for i in range(self.actors))


def group_shapes(plan: Plan, cluster: Cluster | None = None) -> tuple[GroupShape, ...]:
    """One group per rollout group (engines of TP bundles each), then the trainer (one per rank);
    with `cluster`, each bundle's node from the plan's node lists (see the module docstring)."""
    t = plan.trainer
    colocated = plan.mode == "colocated"
    t_nodes = _fill(cluster, "trainer", t.nodes, t.gpus, 1, {}) if cluster is not None else ()
    used: dict[int, int] = {}  # GPUs of each node taken by engines so far (groups may share nodes)
    shapes, offset = [], 0
    for i, g in enumerate(plan.rollout):
        nodes: tuple[int, ...] = ()
        if colocated:
            nodes = t_nodes[offset: offset + g.gpus]
        elif cluster is not None:
            nodes = _fill(cluster, f"rollout group {i}", g.nodes, g.instances, g.tp, used)
        shapes.append(GroupShape("rollout", g.gpu_type, g.instances, g.tp, nodes, colocated,
                                 offset if colocated else 0))
        offset += g.gpus
    shapes.append(GroupShape("train", t.gpu_type, t.gpus, 1, t_nodes))
    return tuple(shapes)


def _fill(cluster: Cluster, what: str, nodes: Sequence[int], actors: int, per_actor: int,
          used: dict[int, int]) -> tuple[int, ...]:
    """Each bundle's node: actors of `per_actor` bundles on the first listed node with room for all of them."""
    if not nodes:
        return ()
    out: list[int] = []
    for _ in range(actors):
        node = next((n for n in nodes if cluster.group_of_node(n).gpus_per_node - used.get(n, 0) >= per_actor), None)
        if node is None:
            raise SpecError(f"{what}: its {actors} x {per_actor} GPUs do not fit on its nodes "
                            f"{', '.join(map(str, nodes))} beside the groups before it; list more nodes in the plan")
        used[node] = used.get(node, 0) + per_actor
        out.extend([node] * per_actor)
    return tuple(out)
