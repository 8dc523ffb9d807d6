"""A plan in the shapes other systems read: AReaL's allocation mode and verl's resource pools."""

from __future__ import annotations

from typing import Any

from traces import Cluster, Plan


def areal(plan: Plan) -> dict[str, str] | str:
    """One allocation-mode string, or one per GPU type when rollout TP degrees differ."""
    if len({g.tp for g in plan.rollout}) == 1:
        return plan.areal_allocation_mode()
    return plan.areal_allocation_modes()


def verl_resource_pools(plan: Plan, cluster: Cluster) -> dict[str, Any]:
    """verl's `resource_pool_spec` (pool -> GPUs used on each node) and the role -> pool mapping.

    Placed plans list their nodes; an unplaced plan packs its GPUs into the type's node size.
    """
    spec: dict[str, list[int]] = {}
    trainer_pool = f"actor_{plan.trainer.gpu_type}"
    spec[trainer_pool] = _per_node(plan.trainer.gpus, plan.trainer.nodes, cluster, plan.trainer.gpu_type)
    rollout_pools: list[str] = []
    for g in plan.rollout:
        name = f"rollout_{g.gpu_type}_tp{g.tp}"
        if plan.mode == "colocated":
            name = trainer_pool
        elif name not in spec:
            spec[name] = []
        if name != trainer_pool:
            spec[name] += _per_node(g.gpus, g.nodes, cluster, g.gpu_type)
        if name not in rollout_pools:
            rollout_pools.append(name)
    mapping = {"Actor": trainer_pool, "RefPolicy": trainer_pool,
               "Rollout": rollout_pools[0] if len(rollout_pools) == 1 else rollout_pools}
    return {"resource_pool_spec": spec, "mapping": mapping}


def _per_node(gpus: int, nodes: tuple[int, ...], cluster: Cluster, gpu_type: str) -> list[int]:
    per_node = cluster.groups_of(gpu_type)[0].gpus_per_node
    count = len(nodes) if nodes else -(-gpus // per_node)
    out, left = [], gpus
    for _ in range(count):
        out.append(min(per_node, left))
        left -= out[-1]
    return [n for n in out if n > 0]


def exports(plan: Plan, cluster: Cluster) -> dict[str, Any]:
    return {"areal_allocation_mode": areal(plan), "verl": verl_resource_pools(plan, cluster)}
