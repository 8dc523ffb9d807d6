"""The network paths of a plan on a cluster: what weight sync from trainer to engines travels over."""

from __future__ import annotations

import math

from traces.cluster import Cluster, NodeGroup
from traces.errors import SpecError
from traces.plan import Plan


def groups_under(cluster: Cluster, gpu_type: str, nodes: tuple[int, ...]) -> list[NodeGroup]:
    """The node groups a plan group sits on: its placed nodes' groups, else every group of its type."""
    if not nodes:
        return cluster.groups_of(gpu_type)
    found = {id(g): g for g in (cluster.group_of_node(n) for n in nodes)}
    name = cluster.resolve(gpu_type).name
    wrong = [g.gpu_type for g in found.values() if cluster.resolve(g.gpu_type).name != name]
    if wrong:
        raise SpecError(f"plan places {gpu_type} work on nodes of type {wrong[0]}; fix the plan's nodes")
    return list(found.values())


def link_bytes_per_s(cluster: Cluster, a: NodeGroup, b: NodeGroup) -> float:
    """Per-GPU bandwidth between nodes of two groups: the slower NIC, capped by a locality link."""
    bw = min(a.inter_node_gb_per_s, b.inter_node_gb_per_s) * 1e9
    label_bw = cluster.label_bandwidth(a.label, b.label)
    return bw if label_bw is None else min(bw, label_bw)


def sync_path_bytes_per_s(cluster: Cluster, plan: Plan) -> float:
    """Slowest link from the trainer's nodes to any engine's nodes (colocated: the node's own link)."""
    if plan.mode == "colocated":
        return cluster.gpu(plan.trainer.gpu_type).link_bytes_per_s
    trainer = groups_under(cluster, plan.trainer.gpu_type, plan.trainer.nodes)
    return min((link_bytes_per_s(cluster, t, e) for g in plan.rollout
                for e in groups_under(cluster, g.gpu_type, g.nodes) for t in trainer), default=math.inf)


def trainer_network(cluster: Cluster, plan: Plan) -> dict[str, float]:
    """The trainer's node size and per-GPU network between its nodes, from the nodes it sits on
    (not its GPU type's slowest group): the keywords the cost model's train and logprob take."""
    groups = groups_under(cluster, plan.trainer.gpu_type, plan.trainer.nodes)
    return {"gpus_per_node": groups[0].gpus_per_node,
            "inter_node_bytes_per_s": min(g.inter_node_gb_per_s for g in groups) * 1e9}
