"""`rlfleet export --to verl`: the Hydra config and overrides verl 0.9 composes into its run config.

Asynchronous and disaggregated on-policy plans run verl's fully_async_policy recipe (or
one_step_off_policy, for staleness 1 only), which size the two roles from `trainer.nnodes` /
`trainer.n_gpus_per_node` and `rollout.nnodes` / `rollout.n_gpus_per_node`: each role is a
rectangle of whole nodes (verl/experimental/separation/utils.py). Colocated plans run the PPO
trainer, whose hybrid engine generates on the trainer's GPUs. verl's pools carry no GPU type:
start the Ray cluster with each role's nodes (the header lists them), or pin with `--to ray`.
"""

from __future__ import annotations

from typing import Any

from planner.exports.roles import Role, nodelist, rollout_role, trainer_role
from traces import Cluster, Plan, SpecError, Workload

RECIPES = {  # recipe -> (config folder relative to the installed verl package, FSDP config, Megatron config)
    "fully_async": ("experimental/fully_async_policy/config", "fully_async_ppo_trainer",
                    "fully_async_ppo_megatron_trainer"),
    "one_step_off": ("experimental/one_step_off_policy/config", "one_step_off_ppo_trainer",
                     "one_step_off_ppo_megatron_trainer"),
    "ppo": ("trainer/config", "ppo_trainer", "ppo_megatron_trainer"),
}
# one_step_off's own search path is relative to verl's source tree (file://verl/trainer/config); the
# package path finds the PPO defaults from any working directory
SEARCH_PATH = "hydra.searchpath=[pkg://verl.trainer.config]"


def default_recipe(plan: Plan) -> str:
    return "ppo" if plan.mode == "colocated" else "fully_async"


def _rectangle(role: Role) -> tuple[int, int]:
    """(nnodes, GPUs per node) of a role; verl cannot give a role part of its last node."""
    if role.gpus <= role.gpus_per_node and role.whole_nodes <= 1:
        return 1, role.gpus
    if role.gpus % role.gpus_per_node or role.gpus != role.whole_nodes * role.gpus_per_node:
        raise SpecError(f"plan: the {role.name} role has {role.gpus} {role.gpu_type} GPUs, not whole nodes of "
                        f"{role.gpus_per_node}; verl sizes a role as nnodes x n_gpus_per_node: "
                        "re-plan with `rlfleet plan --framework verl`")
    return role.whole_nodes, role.gpus_per_node


def _check(plan: Plan, recipe: str) -> None:
    if recipe not in RECIPES:
        raise SpecError(f"--recipe {recipe}: unknown; use one of {', '.join(RECIPES)}")
    if plan.mode == "colocated" and recipe != "ppo":
        raise SpecError(f"--recipe {recipe} cannot colocate rollout and training (it needs separate rollout "
                        "nodes); export the colocated plan with --recipe ppo, or re-plan with mode async")
    if plan.mode != "colocated" and recipe == "ppo":
        raise SpecError(f"--recipe ppo colocates rollout and training, but this plan is {plan.mode} on separate "
                        "GPUs: use --recipe fully_async, or re-plan the workload with mode: colocated")
    if recipe == "one_step_off" and not (plan.mode == "async" and plan.staleness == 1):
        raise SpecError(f"--recipe one_step_off runs exactly one step off-policy, but the plan has staleness "
                        f"{plan.staleness}: use --recipe fully_async")


def spec(plan: Plan, cluster: Cluster, workload: Workload, recipe: str | None = None) -> dict[str, Any]:
    """{"config_dir", "config_name", "overrides"}: hydra.compose(config_name, overrides) in config_dir."""
    recipe = recipe or default_recipe(plan)
    _check(plan, recipe)
    rollout, trainer = rollout_role(plan, cluster, "verl"), trainer_role(plan, cluster)
    if workload.prompts_per_step % workload.ppo_minibatches:
        raise SpecError(f"workload: prompts_per_step ({workload.prompts_per_step}) is not a multiple of "
                        f"ppo_minibatches ({workload.ppo_minibatches}); verl's minibatch is a whole number of "
                        "prompts: change one of them")
    t = plan.trainer
    megatron = t.tp > 1 or t.pp > 1 or t.ep > 1  # FSDP has no expert parallelism
    folder, fsdp_name, megatron_name = RECIPES[recipe]
    nnodes, per_node = _rectangle(trainer)
    minibatch = workload.prompts_per_step // workload.ppo_minibatches
    over = [f"trainer.nnodes={nnodes}", f"trainer.n_gpus_per_node={per_node}",
            *_rollout_parallel(rollout),
            f"actor_rollout_ref.rollout.n={workload.group_size}",
            f"data.train_batch_size={workload.prompts_per_step}",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={minibatch}",
            f"data.max_prompt_length={workload.prompt_len.max}",
            f"data.max_response_length={workload.max_seq_len - workload.prompt_len.max}"]
    if megatron:
        over += [f"actor_rollout_ref.actor.megatron.tensor_model_parallel_size={t.tp}",
                 f"actor_rollout_ref.actor.megatron.pipeline_model_parallel_size={t.pp}"]
    if t.ep > 1:  # Megatron-Core expert parallelism over ep of the dp x tp ranks, experts whole
        over += [f"actor_rollout_ref.actor.megatron.expert_model_parallel_size={t.ep}",
                 "actor_rollout_ref.actor.megatron.expert_tensor_parallel_size=1"]
    if workload.lora_rank:
        if megatron:
            raise SpecError(f"workload: lora_rank {workload.lora_rank} with a Megatron trainer (tp {t.tp}, pp {t.pp}, "
                            f"ep {t.ep}); the export sets verl's LoRA for FSDP actors (actor_rollout_ref.model."
                            "lora_rank): re-plan with a tp1 pp1 trainer or set lora_rank: 0")
        # every linear layer adapted, as rlfleet prices it (traces.lora); the rollout loads the adapter
        over += [f"actor_rollout_ref.model.lora_rank={workload.lora_rank}",
                 f"actor_rollout_ref.model.lora_alpha={2 * workload.lora_rank}",
                 "actor_rollout_ref.model.target_modules=all-linear"]
    a = workload.agentic
    if a is not None:  # verl's tool agent loop: an episode's turns, tool results cut at their cap
        prefix = "actor_rollout_ref.rollout.multi_turn"
        over += [f"{prefix}.enable=True", f"{prefix}.max_assistant_turns={a.turns.max}",
                 f"{prefix}.max_user_turns={a.max_tool_calls}",
                 f"{prefix}.max_tool_response_length={a.tool_tokens.max}"]
    if recipe != "ppo":
        r_nodes, r_per_node = _rectangle(rollout)
        over += [SEARCH_PATH, f"rollout.nnodes={r_nodes}", f"rollout.n_gpus_per_node={r_per_node}"]
    if recipe == "fully_async":
        # the rollouter admits required_samples x (staleness_threshold + 1) x trigger_parameter_sync_step
        # samples per weight version (fully_async_rollouter.py, set_max_required_samples): with one
        # minibatch per local step and a sync every ppo_minibatches steps that is (eta + 1) batches,
        # AReaL's capacity rule that rlfleet plans with
        over += [f"async_training.staleness_threshold={float(plan.staleness)}",
                 f"async_training.trigger_parameter_sync_step={workload.ppo_minibatches}",
                 "async_training.require_batches=1",
                 f"async_training.partial_rollout={workload.interruptible}"]
    return {"config_dir": folder, "config_name": megatron_name if megatron else fsdp_name, "overrides": over}


def _rollout_parallel(rollout: Role) -> list[str]:
    """The rollout replica's layout: TP tp, or (EP) data-parallel attention over its tp GPUs with the
    experts split over all of them (verl's rollout data_parallel_size and expert_parallel_size)."""
    prefix = "actor_rollout_ref.rollout"
    if rollout.ep == 1:
        return [f"{prefix}.tensor_model_parallel_size={rollout.tp}"]
    return [f"{prefix}.tensor_model_parallel_size=1", f"{prefix}.data_parallel_size={rollout.ep}",
            f"{prefix}.expert_parallel_size={rollout.ep}"]


def header(plan: Plan, cluster: Cluster, names: list[str]) -> list[str]:
    rollout, trainer = rollout_role(plan, cluster, "verl"), trainer_role(plan, cluster)
    lines = [f"verl 0.9 Hydra config for the {plan.mode} plan of {plan.workload or 'the workload'} on "
             f"{plan.cluster or cluster.name}: compose config_name in config_dir (relative to the installed verl "
             "package) with the overrides, e.g. python -m verl.experimental.fully_async_policy.fully_async_main "
             "<overrides>",
             "verl's resource pools carry no GPU type: give the Ray cluster these nodes per role"]
    for role in (rollout, trainer):
        where = f" on {nodelist(role, names)}" if role.nodes else ""
        lines.append(f"{role.name}: {role.gpus} {role.gpu_type}{where}")
    return lines
