"""What every export needs to know about a plan's roles: GPU type, engine kind, GPUs, nodes, host names.

A role is the rollout (all engines) or the trainer. AReaL and verl describe each role with one
engine kind (one backend, one TP, one GPU type), so plans whose rollout mixes kinds are refused
with the fix: re-plan with `rlfleet plan --framework NAME`, which searches only such plans.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

import hostlist

from traces import Cluster, Plan, SpecError


@dataclass(frozen=True)
class Role:
    """One role's GPUs: `gpus` of `gpu_type` on nodes `nodes` (cluster indices; empty when unplaced)."""

    name: Literal["rollout", "train"]
    gpu_type: str
    gpus: int
    nodes: tuple[int, ...]
    gpus_per_node: int
    tp: int  # the rollout's engine TP; the trainer's tensor-parallel degree
    ep: int = 1  # the rollout's engine EP (1 or tp); the trainer's expert-parallel degree

    @property
    def whole_nodes(self) -> int:
        """Nodes the role spans: its node list when placed, else its GPUs packed into nodes."""
        return len(self.nodes) if self.nodes else -(-self.gpus // self.gpus_per_node)


def node_size(cluster: Cluster, gpu_type: str, nodes: tuple[int, ...]) -> int:
    if nodes:
        sizes = {cluster.group_of_node(n).gpus_per_node for n in nodes}
        if len(sizes) == 1:
            return sizes.pop()
    return cluster.groups_of(gpu_type)[0].gpus_per_node


def rollout_role(plan: Plan, cluster: Cluster, framework: str) -> Role:
    """The rollout as one engine kind, or SpecError naming the re-plan that makes it one."""
    kinds = sorted({(g.gpu_type, g.tp, g.ep) for g in plan.rollout})
    if len(kinds) != 1:
        have = ", ".join(f"{t} TP{tp}" + (f" EP{ep}" if ep > 1 else "") for t, tp, ep in kinds)
        raise SpecError(f"plan: the rollout mixes engine kinds ({have}); {framework} runs one rollout engine kind "
                        f"on one GPU type: re-plan with `rlfleet plan --framework {framework}`")
    gpu_type, tp, ep = kinds[0]
    nodes = tuple(sorted({n for g in plan.rollout for n in g.nodes}))
    gpus = sum(g.gpus for g in plan.rollout)
    return Role("rollout", gpu_type, gpus, nodes, node_size(cluster, gpu_type, nodes), tp, ep)


def trainer_role(plan: Plan, cluster: Cluster) -> Role:
    t = plan.trainer
    return Role("train", t.gpu_type, t.gpus, t.nodes, node_size(cluster, t.gpu_type, t.nodes), t.tp, t.ep)


def host_names(cluster: Cluster, hosts: str | os.PathLike[str] | None) -> list[str]:
    """One host name per cluster node, in the cluster file's node order: `hosts` lists them one a
    line; without it they are node0, node1, ..."""
    count = sum(g.nodes for g in cluster.node_groups)
    if hosts is None:
        return [f"node{i}" for i in range(count)]
    try:
        with open(hosts, encoding="utf-8") as handle:
            names = [line.strip() for line in handle if line.strip() and not line.lstrip().startswith("#")]
    except OSError as exc:
        raise SpecError(f"--hosts {hosts}: cannot read ({exc.strerror}); give a file with one host name a line") \
            from None
    if len(names) != count:
        raise SpecError(f"--hosts {hosts}: lists {len(names)} hosts but cluster '{cluster.name}' has {count} nodes; "
                        "give one host name per node, in the cluster file's order")
    return names


def nodelist(role: Role, names: list[str]) -> str | None:
    """Slurm's compressed host list of a placed role (e.g. node[8-17]); None when the plan is unplaced."""
    if not role.nodes:
        return None
    return str(hostlist.collect_hostlist([names[n] for n in role.nodes]))
