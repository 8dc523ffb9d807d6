"""`rlfleet export --to slurm`: a heterogeneous-job script skeleton, one component per plan group.

Each component (`#SBATCH hetjob` separates them, sbatch(1) "HETEROGENEOUS JOB SUPPORT") asks for
its group's nodes by name, so each GPU type does what the plan says; the srun lines at the end
start one task per engine (rollout) or per rank (trainer) with the commands left to fill in.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.exports.roles import Role, node_size, nodelist, trainer_role
from traces import Cluster, Plan


@dataclass(frozen=True)
class Component:
    label: str
    role: Role
    tasks_per_node: int  # engines (rollout) or ranks (trainer) per node

    @property
    def gpus_per_node(self) -> int:
        return min(self.role.gpus_per_node, self.role.gpus)


def components(plan: Plan, cluster: Cluster) -> list[Component]:
    t, train = plan.trainer, trainer_role(plan, cluster)
    out = [Component(f"train {t.gpus} {t.gpu_type} (dp{t.dp} tp{t.tp} pp{t.pp})", train,
                     min(train.gpus_per_node, t.gpus))]
    if plan.mode == "colocated":  # the engines share the trainer's GPUs: no component of their own
        return out
    for g in plan.rollout:
        role = Role("rollout", g.gpu_type, g.gpus, g.nodes, node_size(cluster, g.gpu_type, g.nodes), g.tp)
        out.append(Component(f"rollout {g.instances} x {g.gpu_type} TP{g.tp} engines", role,
                             max(1, min(role.gpus_per_node, g.gpus) // g.tp)))
    return out


def script(plan: Plan, cluster: Cluster, names: list[str], job_name: str) -> str:
    lines = ["#!/bin/bash",
             f"# rlfleet export --to slurm: the {plan.mode} plan of {plan.workload or 'the workload'} on "
             f"{plan.cluster or cluster.name}",
             "# a heterogeneous job, one component per plan group"]
    parts = components(plan, cluster)
    for i, c in enumerate(parts):
        if i:
            lines.append("#SBATCH hetjob")
        lines.append(f"# component {i}: {c.label}")
        if i == 0:
            lines.append(f"#SBATCH --job-name={job_name}")
        if c.role.gpus == c.role.whole_nodes * c.gpus_per_node:
            lines += [f"#SBATCH --nodes={c.role.whole_nodes}", f"#SBATCH --ntasks-per-node={c.tasks_per_node}",
                      f"#SBATCH --gpus-per-node={c.gpus_per_node}"]
        else:  # a group on part of its nodes (another group has the rest): its GPUs in all, one task each
            tasks = c.role.gpus // c.role.tp if c.role.name == "rollout" else c.role.gpus
            lines += ["# part of these nodes: the partition must let components share a node (OverSubscribe)",
                      f"#SBATCH --nodes={c.role.whole_nodes}", f"#SBATCH --ntasks={tasks}",
                      f"#SBATCH --gpus={c.role.gpus}"]
        where = nodelist(c.role, names)
        if where is not None:
            lines.append(f"#SBATCH --nodelist={where}")
    lines.append("")
    if plan.mode == "colocated":
        lines.append("# colocated: the rollout engines run inside the trainer's processes")
    for i, c in enumerate(parts):  # the commands come from the environment, so the skeleton runs as it is
        what = "TRAINER_COMMAND" if c.role.name == "train" else "ROLLOUT_ENGINE_COMMAND"
        lines.append(f"srun --het-group={i} ${{{what}:?set {what}}} &  # {c.label}, one task per "
                     + ("rank" if c.role.name == "train" else f"TP{c.role.tp} engine"))
    lines.append("wait")
    return "\n".join(lines) + "\n"
