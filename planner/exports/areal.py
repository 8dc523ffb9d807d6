"""`rlfleet export --to areal`: a YAML that merges into AReaL 1.0's `GRPOConfig`.

AReaL 1.0 describes each engine by its own `backend` string (`rollout.backend: vllm:d20t4`,
`actor.backend: fsdp:d64`; areal.api.alloc_mode.ModelAllocation parses them); the top-level
`allocation_mode` is deprecated. Which nodes each role runs on is AReaL's own per-role field
`scheduling_spec[0].nodelist`, which its Slurm scheduler passes to sbatch (areal/infra/scheduler/
slurm.py), so the node lists live inside GRPOConfig and nothing is left over to a sidecar. AReaL's
Ray scheduler has no GPU-type field: on Ray use `rlfleet export --to ray` for the placement.
"""

from __future__ import annotations

import re
from typing import Any

from planner.exports.roles import Role, nodelist, rollout_role, trainer_role
from traces import Cluster, Plan, SpecError, Workload

RPC_SERVER = "python -m areal.infra.rpc.rpc_server"  # AReaL's default worker command (cli_args.SchedulingSpec)


def backend(plan: Plan, role: Role) -> str:
    """The ModelAllocation string of a role: vllm:d<engines>t<tp>, or fsdp:d<dp> / megatron:d<dp>p<pp>t<tp>;
    an expert-parallel trainer as MoE parallel folding, megatron:(attn:d<dp>p<pp>t<tp>|ffn:d<edp>p<pp>t1e<ep>)
    (expert tensor parallelism 1, edp = dp tp / ep: AReaL's ParallelStrategy, after Megatron-Core)."""
    if role.name == "rollout":
        if role.ep > 1:
            raise SpecError(f"plan: the rollout runs expert-parallel engines (TP{role.tp} EP{role.ep}); AReaL's "
                            "rollout backend string has no expert-parallel dimension: re-plan with "
                            "`rlfleet plan --framework areal`")
        return f"vllm:d{role.gpus // role.tp}t{role.tp}"
    t = plan.trainer
    if t.ep > 1:
        return f"megatron:(attn:d{t.dp}p{t.pp}t{t.tp}|ffn:d{t.dp * t.tp // t.ep}p{t.pp}t1e{t.ep})"
    if t.tp == 1 and t.pp == 1:
        return f"fsdp:d{t.dp}"
    return f"megatron:d{t.dp}p{t.pp}t{t.tp}"


def _spec(role: Role, names: list[str]) -> list[dict[str, Any]]:
    # gpu > 0 makes AReaL's controllers ask for the role's GPUs (they scale it by the instance size)
    spec: dict[str, Any] = {"gpu": 1, "cmd": RPC_SERVER}
    where = nodelist(role, names)
    if where is not None:
        spec["nodelist"] = where
    return [spec]


def config(plan: Plan, cluster: Cluster, workload: Workload, names: list[str]) -> dict[str, Any]:
    if workload.agentic is not None:
        raise SpecError("workload: agentic episodes run in AReaL through a rollout workflow written in Python (its "
                        "multi-turn workflow), not a GRPOConfig field: export --to verl, or set the workflow yourself")
    rollout, trainer = rollout_role(plan, cluster, "areal"), trainer_role(plan, cluster)
    if rollout.gpus_per_node != trainer.gpus_per_node:
        raise SpecError(f"plan: rollout nodes have {rollout.gpus_per_node} GPUs and trainer nodes "
                        f"{trainer.gpus_per_node}; AReaL's cluster.n_gpus_per_node is one number: "
                        "re-plan with `rlfleet plan --framework areal`")
    if plan.staleness != int(plan.staleness):
        raise SpecError(f"plan: staleness {plan.staleness} is a fraction of a batch; AReaL's "
                        "max_head_offpolicyness counts whole versions: use a whole staleness or --framework verl")
    colocated = plan.mode == "colocated"
    nodes = trainer.whole_nodes if colocated else trainer.whole_nodes + rollout.whole_nodes
    out: dict[str, Any] = {
        "experiment_name": re.sub(r"[_/]", "-", workload.name),  # AReaL: no '_' or '/'
        "trial_name": re.sub(r"[-/]", "_", f"{plan.cluster or cluster.name}_{plan.mode}"),  # no '-' or '/'
        "cluster": {"n_nodes": nodes, "n_gpus_per_node": trainer.gpus_per_node},
        "rollout": {"backend": backend(plan, rollout), "max_head_offpolicyness": int(plan.staleness),
                    "scheduling_spec": _spec(rollout, names)},
        "actor": {"backend": backend(plan, trainer), "ppo_n_minibatches": workload.ppo_minibatches,
                  "scheduling_spec": _spec(trainer, names)},
        "train_dataset": {"batch_size": workload.prompts_per_step},
        "gconfig": {"n_samples": workload.group_size, "max_new_tokens": workload.response_len.max,
                    "max_tokens": workload.max_seq_len},
    }
    # the names AReaL's sections need, tied to the top-level ones as AReaL's example configs do
    names_of = {"experiment_name": "${experiment_name}", "trial_name": "${trial_name}"}
    for section in ("saver", "evaluator", "stats_logger", "recover"):
        out[section] = {**names_of, "fileroot": "${cluster.fileroot}"}
    out["actor"].update(names_of)
    out["rollout"].update(names_of)
    if plan.max_concurrent_rollouts is not None:
        out["rollout"]["max_concurrent_rollouts"] = plan.max_concurrent_rollouts
    if workload.lora_rank:
        if not out["actor"]["backend"].startswith("fsdp"):
            raise SpecError(f"workload: lora_rank {workload.lora_rank} with a {out['actor']['backend']} trainer; AReaL "
                            "trains LoRA on FSDP only (TrainEngineConfig.use_lora): re-plan with a tp1 pp1 trainer "
                            "or set lora_rank: 0")
        # every linear layer adapted, as rlfleet prices it (traces.lora); the engines load the adapter
        out["actor"].update({"use_lora": True, "lora_rank": workload.lora_rank, "lora_alpha": 2 * workload.lora_rank,
                             "target_modules": ["all-linear"]})
        out["rollout"]["use_lora"] = True
        out["vllm"] = {"enable_lora": True, "max_lora_rank": workload.lora_rank}
    if colocated:
        # the actor starts first (areal/trainer/rl_trainer.py), so the rollout joins its workers
        out["rollout"]["scheduling_strategy"] = {"type": "colocation", "target": "actor"}
        out["rollout"]["scheduling_spec"][0].pop("nodelist", None)
    return out


def header(plan: Plan, cluster: Cluster, names: list[str]) -> list[str]:
    rollout, trainer = rollout_role(plan, cluster, "areal"), trainer_role(plan, cluster)
    return [f"AReaL 1.0 GRPOConfig fields for the {plan.mode} plan of {plan.workload or 'the workload'} on "
            f"{plan.cluster or cluster.name} (merge into your experiment YAML)",
            f"rollout: {rollout.gpus // rollout.tp} x {rollout.gpu_type} TP{rollout.tp} engines"
            + (f" on {nodelist(rollout, names)}" if rollout.nodes else ""),
            f"trainer: {trainer.gpus} {trainer.gpu_type}"
            + (f" on {nodelist(trainer, names)}" if trainer.nodes else "")]
