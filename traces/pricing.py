"""What a plan costs per hour, priced by the node groups its GPUs sit in (one rule for planner, simulator, reports).

Two node groups of one GPU type may have different prices (a cluster file's price_per_gpu_hour),
so a plan group is priced by the nodes it was placed on, never by its GPU type alone. A group with
no nodes listed (a hand-written, unplaced plan) fills that type's node groups in file order.
Colocated plans share the trainer's GPUs: only the trainer's are counted.
"""

from __future__ import annotations

from collections.abc import Sequence

from traces.cluster import Cluster
from traces.plan import Plan


def _placed(cluster: Cluster, gpus: int, nodes: Sequence[int]) -> float:
    share = gpus / len(nodes)  # spread evenly over its nodes
    return sum(share * cluster.group_gpu(cluster.group_of_node(n)).price_per_gpu_hour for n in nodes)


def _unplaced(cluster: Cluster, gpu_type: str, gpus: int) -> float:
    total, left = 0.0, gpus
    groups = cluster.groups_of(gpu_type)
    for group in groups:
        take = min(left, group.gpus)
        total, left = total + take * cluster.group_gpu(group).price_per_gpu_hour, left - take
    if left > 0 and groups:  # more GPUs than the cluster has: priced as its last group (validation refuses)
        total += left * cluster.group_gpu(groups[-1]).price_per_gpu_hour
    return total


def plan_price_per_hour(cluster: Cluster, plan: Plan) -> float:
    """$/h of every GPU the plan uses."""
    groups: list[tuple[str, int, tuple[int, ...]]] = [(plan.trainer.gpu_type, plan.trainer.gpus, plan.trainer.nodes)]
    if plan.mode != "colocated":
        groups += [(g.gpu_type, g.gpus, g.nodes) for g in plan.rollout]
    price, unplaced = 0.0, dict[str, int]()
    for gpu_type, gpus, nodes in groups:
        if nodes:
            price += _placed(cluster, gpus, nodes)
        else:
            unplaced[gpu_type] = unplaced.get(gpu_type, 0) + gpus
    return price + sum(_unplaced(cluster, t, n) for t, n in unplaced.items())
