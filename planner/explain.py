"""Why a request has no plan, and the nearest fix."""

from __future__ import annotations

import math

from planner.candidates import Candidates
from planner.milp import Mode, Objective, solve
from traces import Cluster, CostModel, SpecError, Workload

# Largest --budget ($/h) or --target (samples/s) taken: beyond any fleet by far, and values near 1e20
# make HiGHS (through PuLP) fail on the MILP's right-hand side instead of reporting it infeasible.
MAX_REQUEST = 1e15


class NoPlan(SpecError):
    """The request is well-formed but nothing satisfies it; the message says why and what to change."""


def check_request(objective: str, budget: float | None, target: float | None, top_k: int, sim_steps: int) -> None:
    if objective not in ("throughput", "cost"):
        raise SpecError(f"objective must be 'throughput' or 'cost', got '{objective}'")
    if objective == "cost" and target is None:
        raise SpecError("objective 'cost' needs a target: --target SAMPLES_PER_S (the throughput to reach)")
    for name, value in (("budget", budget), ("target", target)):
        if value is not None and not (value > 0 and math.isfinite(value)):
            raise SpecError(f"{name} must be a positive number, got {value}")
        if value is not None and value > MAX_REQUEST:
            raise SpecError(f"{name} {value:g} is beyond any fleet; give at most {MAX_REQUEST:g}")
    if not 1 <= top_k <= 100:
        raise SpecError(f"top_k must be between 1 and 100, got {top_k}")
    if not 0 <= sim_steps <= 1000:
        raise SpecError(f"sim_steps must be between 0 and 1000, got {sim_steps}")


def explain_empty(cm: CostModel, cluster: Cluster, workload: Workload, cand: Candidates, mode: Mode,
                  objective: Objective, budget: float | None, target: float | None, solver: str) -> None:
    """Raise NoPlan with the first reason that applies."""
    model = workload.model
    if not cand.engines:
        best = max(((float(cm.kv_capacity_tokens(p.gpu, model, p.per_node)), p) for p in cand.pools),
                   key=lambda kv: kv[0])
        raise NoPlan(
            f"{model.name} fits no rollout engine on this cluster: the largest KV cache (TP{best[1].per_node} on "
            f"{best[1].gpu.name}) holds {max(best[0], 0):.0f} tokens, one sample needs {workload.max_seq_len}; "
            "use GPUs with more memory or shorter prompts/responses"
        )
    if not cand.trainers:
        need = _smallest_trainer_gb(cm, workload)
        biggest = max(cand.pools, key=lambda p: p.gpus * p.gpu.hbm_gb)
        raise NoPlan(
            f"no trainer layout of {model.name} fits in memory: its weights, gradients and Adam states alone need "
            f"about {need:.0f} GB, and the largest pool ({biggest.gpus} {biggest.gpu.name}) has "
            f"{biggest.gpus * biggest.gpu.hbm_gb:.0f} GB; add GPUs or use a smaller model"
        )
    if mode == "async" and not _two_places(cand):
        raise NoPlan("an async plan needs at least two nodes (the trainer takes whole nodes, engines need another); "
                     "add a node or plan with mode: colocated")
    if budget is not None:
        cheapest = _cheapest(cand, mode)
        if budget < cheapest:
            raise NoPlan(f"budget ${budget:.2f}/h is below the cheapest feasible plan (${cheapest:.2f}/h: the "
                         f"smallest trainer plus one engine); raise the budget to at least ${cheapest:.2f}/h")
    if target is not None:
        best = solve(cand, mode, "throughput", budget, None, 1, solver)
        top = best[0].samples_per_s if best else 0.0
        within = f" within ${budget:.2f}/h" if budget is not None else ""
        raise NoPlan(f"target {target:g} samples/s is above the most this fleet can do{within} "
                     f"({top:.2f} samples/s, analytic); lower the target, raise the budget or add GPUs")
    raise NoPlan("no plan satisfies the request; check the cluster has GPUs for both the trainer and the engines")


def _two_places(cand: Candidates) -> bool:
    return any(t.nodes < cand.pools[t.pool].nodes or any(o.pool != t.pool for o in cand.engines)
               for t in cand.trainers)


def _cheapest(cand: Candidates, mode: Mode) -> float:
    trainer = min(t.price_per_hour for t in cand.trainers)
    return trainer if mode == "colocated" else trainer + min(o.price_per_hour for o in cand.engines)


def _smallest_trainer_gb(cm: CostModel, workload: Workload) -> float:
    from traces.costmodel.roofline import train_state_bytes

    return float(train_state_bytes(workload.model, 1, 1, 1, zero_stage=0, lora_rank=workload.lora_rank)) / 1e9
