"""Whole-plan validation: a plan must fit its cluster and agree with its workload (validate, simulate, plan, run).

Every problem is listed in one line, so a user fixes them all at once. The rules:
- every GPU type the plan uses is in the cluster, in no larger number than the cluster has;
- an engine's TP fits in one node of its type and divides the model's attention heads (vLLM
  shards heads over TP ranks; with more ranks than KV heads each KV head is replicated, so TP must
  then be a multiple of the KV heads); the trainer's TP likewise; its PP divides no more stages
  than the model has layers;
- an engine's EP is 1 or its TP, a trainer's divides its dp x tp ranks, and either divides the
  model's experts (a dense model takes EP 1 only);
- node indices exist, are of the group's GPU type and hold the group's GPUs; the trainer's are
  its own (a colocated plan's engines share them); engine groups may pack onto common nodes
  if their GPUs fit there together;
- the plan's execution policy is the one the workload asks for (mode; staleness in async mode):
  the plan is the policy, so a contradiction is refused rather than silently decided;
- GRPO needs at least two responses per prompt (its advantage is relative to the group's mean).
"""

from __future__ import annotations

from collections.abc import Sequence

from traces.cluster import Cluster
from traces.errors import SpecError
from traces.models import ModelSpec
from traces.plan import Plan
from traces.workload import Workload


def tp_shards(model: ModelSpec, tp: int) -> str | None:
    """Why `model` cannot be split over `tp` tensor-parallel ranks, or None if it can (vLLM's and
    Megatron's rule: heads divide evenly; KV heads divide evenly, or are replicated when tp is a
    multiple of them)."""
    if model.heads % tp:
        return f"TP {tp} does not divide {model.name}'s {model.heads} attention heads"
    kv = model.kv_heads
    if (tp > kv and tp % kv) or (tp <= kv and kv % tp):
        return f"TP {tp} does not split {model.name}'s {kv} KV heads evenly"
    return None


def ep_shards(model: ModelSpec | None, ep: int, ranks: int, engine: bool) -> str | None:
    """Why `ep` expert-parallel ranks cannot split `model`'s experts over a group of `ranks` GPUs
    (an engine's tp, a trainer's dp x tp), or None if they can. An engine's EP spans all its GPUs
    (data-parallel attention) or none; a trainer's divides its dp x tp ranks (Megatron-Core's
    expert parallelism); either way the experts divide evenly over the ranks."""
    if ep == 1:
        return None
    if engine and ep != ranks:
        return f"EP {ep} must be 1 or the engine's TP ({ranks})"
    if not engine and ranks % ep:
        return f"EP {ep} does not divide the trainer's dp x tp = {ranks} ranks"
    if model is None:
        return None
    if model.moe is None:
        return f"EP {ep} needs a mixture-of-experts model; {model.name} is dense: use EP 1"
    if model.moe.experts % ep:
        return f"EP {ep} does not divide {model.name}'s {model.moe.experts} experts"
    return None


def _tp_problems(what: str, tp: int, per_node: int, gpu_type: str, model: ModelSpec | None) -> list[str]:
    out = []
    if tp > per_node:
        out.append(f"{what} TP {tp} exceeds the {per_node} GPUs per {gpu_type} node")
    why = tp_shards(model, tp) if model is not None else None
    if why is not None:
        out.append(f"{what} {why}")
    return out


def _node_problems(cluster: Cluster, what: str, gpu_type: str, gpus: int, nodes: Sequence[int]) -> list[str]:
    if not nodes:
        return []
    total = sum(g.nodes for g in cluster.node_groups)
    bad = [n for n in nodes if not 0 <= n < total]
    if bad:
        return [f"{what} lists node {bad[0]}, but cluster '{cluster.name}' has nodes 0-{total - 1}"]
    out = []
    def type_of(n: int) -> str:
        return cluster.resolve(cluster.group_of_node(n).gpu_type).name

    wrong = [n for n in nodes if type_of(n) != gpu_type]
    if wrong:
        out.append(f"{what} places {gpu_type} work on nodes of type {type_of(wrong[0])} (node {wrong[0]})")
    room = sum(cluster.group_of_node(n).gpus_per_node for n in nodes if n not in wrong)
    if not wrong and gpus > room:
        out.append(f"{what} needs {gpus} GPUs but its {len(nodes)} node(s) hold {room}")
    return out


def _known(cluster: Cluster, gpu_type: str) -> str:
    """The canonical name of a plan's GPU type (a cluster's own types too; any case), or as given."""
    try:
        return cluster.resolve(gpu_type).name
    except SpecError:
        return gpu_type


def count_problems(cluster: Cluster, plan: Plan) -> list[str]:
    """GPU types the cluster lacks, or has fewer of than the plan uses (empty: it holds the plan)."""
    have, out = cluster.gpu_counts, []
    for given, n in plan.gpus_in_use.items():
        gpu_type = _known(cluster, given)
        if gpu_type not in have:
            out.append(f"plan uses {gpu_type} GPUs but cluster '{cluster.name}' has none "
                       f"(it has {', '.join(have)})")
        elif n > have[gpu_type]:
            out.append(f"plan uses {n} {gpu_type} GPUs but cluster '{cluster.name}' has {have[gpu_type]}")
    return out


def plan_problems(cluster: Cluster, workload: Workload | None, plan: Plan) -> list[str]:
    """Every way the plan does not fit the cluster or the workload (empty: it does); without a
    workload, only what the cluster alone decides (no head counts, no policy)."""
    out: list[str] = []
    have = cluster.gpu_counts
    out += count_problems(cluster, plan)
    model = workload.model if workload is not None else None
    t = plan.trainer
    if plan.mode == "colocated":
        if any(g.gpu_type != t.gpu_type for g in plan.rollout):
            out.append("colocated plan: rollout groups must use the trainer's GPU type")
        if sum(g.gpus for g in plan.rollout) > t.gpus:
            out.append("colocated plan: rollout engines need more GPUs than the trainer has")
    for i, g in enumerate(plan.rollout):
        name = _known(cluster, g.gpu_type)
        groups = cluster.groups_of(name) if name in have else []
        if groups:
            out += _tp_problems(f"rollout group {i}", g.tp, max(ng.gpus_per_node for ng in groups), name, model)
        why = ep_shards(model, g.ep, g.tp, engine=True)
        if why is not None:
            out.append(f"rollout group {i} {why}")
        out += _node_problems(cluster, f"rollout group {i}", name, g.gpus, g.nodes)
    name = _known(cluster, t.gpu_type)
    groups = cluster.groups_of(name) if name in have else []
    if groups:
        out += _tp_problems("trainer", t.tp, max(ng.gpus_per_node for ng in groups), name, model)
    why = ep_shards(model, t.ep, t.dp * t.tp, engine=False)
    if why is not None:
        out.append(f"trainer {why}")
    if model is not None and t.pp > model.layers:
        out.append(f"trainer PP {t.pp} is more stages than {model.name}'s {model.layers} layers")
    out += _node_problems(cluster, "trainer", name, t.gpus, t.nodes)
    out += _shared_nodes(cluster, plan)
    if workload is None:
        return out
    out += policy_problems(workload, plan)
    if workload.algorithm == "grpo" and workload.group_size < 2:
        out.append(f"GRPO needs group_size >= 2 (responses per prompt), got {workload.group_size}")
    return out


def _shared_nodes(cluster: Cluster, plan: Plan) -> list[str]:
    """The trainer's nodes are its own (but a colocated plan's engines share them); engine groups may
    pack onto common nodes, if the GPUs of the groups that share nodes fit on those nodes together."""
    out = []
    trainer = set(plan.trainer.nodes)
    if plan.mode != "colocated":
        for i, g in enumerate(plan.rollout):
            both = sorted(trainer & set(g.nodes))
            if both:
                out.append(f"node {both[0]} is listed by both the trainer and rollout group {i}")
    packs: list[tuple[set[int], int]] = []  # nodes shared by engine groups, and their GPUs
    for g in plan.rollout:
        nodes, gpus = set(g.nodes), g.gpus
        if not nodes:
            continue
        for pack in [pk for pk in packs if pk[0] & nodes]:
            packs.remove(pack)
            nodes, gpus = nodes | pack[0], gpus + pack[1]
        packs.append((nodes, gpus))
    total = sum(ng.nodes for ng in cluster.node_groups)
    for nodes, gpus in packs:
        room = sum(cluster.group_of_node(n).gpus_per_node for n in nodes if 0 <= n < total)
        if gpus > room:
            out.append(f"rollout groups on nodes {min(nodes)}-{max(nodes)} need {gpus} GPUs but those nodes "
                       f"hold {room}")
    return out


def policy_problems(workload: Workload, plan: Plan) -> list[str]:
    """Mode and staleness: asked for by the workload, built into the plan; they must agree."""
    if workload.mode != plan.mode:
        return [f"the workload asks mode {workload.mode} but the plan was built for {plan.mode}; "
                f"re-plan, or set the workload's mode to {plan.mode}"]
    if plan.mode == "async" and workload.staleness != plan.staleness:
        return [f"the workload asks staleness {workload.staleness} but the plan was built for "
                f"{plan.staleness}; re-plan, or set the workload's staleness to {plan.staleness}"]
    return []


def check_plan(cluster: Cluster, workload: Workload | None, plan: Plan) -> None:
    """SpecError listing every problem of `plan_problems`, or nothing."""
    problems = plan_problems(cluster, workload, plan)
    if problems:
        raise SpecError("; ".join(problems))
