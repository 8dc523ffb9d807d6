"""What one more node of each kind would buy: analytic samples/s per added GPU.

Each value is the best plan re-solved with one more node of that kind (same model, same budget),
less the fleet's own best, per GPU of the node. The re-solves reuse the request's work
(Search.candidates and Search.solve: the fleet's best is the request's own MILP answer when the
request asked the same question), so only one MILP per kind of node is new. Those MILPs depend on
the request's fleet, job and budget alone, not on its search: with workers they are asked once the
request's own MILP has answered (`ask_ahead`) and solved beside its search, in its worker processes,
each the same MILP as asked at the end. Each starts its async fixed point at the fleet's own best
rate (one node more moves it little), which ends most of them after one round instead of three or
four (planner.milp.solve_async's `start_rate`; tests/test_plan_speed.py checks the values against
re-planning from no derating).
The LP relaxation's duals of the GPU-count rows (cheaper still) were measured against these
re-solves and are no substitute: the trainer's whole-node binaries make the integer gain a step
the relaxation does not see (issue 19: duals of 0.0004 against re-solved gains of 0.076 per GPU).
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import numpy as np

from planner.milp import Mode, Solution
from planner.parallel import SolveJob, light_cost_model, solve_job
from planner.scoring import Search
from traces import Cluster

Ahead = dict[str, Future[tuple[list[Solution], str | None]]]  # kind of node -> its fleet's MILP answer, coming


def fleet_best(search: Search, cluster: Cluster, mode: Mode, budget: float | None) -> float:
    """The most analytic samples/s a plan of `cluster` reaches within `budget` (0 if none)."""
    found = search.solve(search.candidates(cluster=cluster), mode, 1, **_question(budget))
    return found[0].samples_per_s if found else 0.0


def _question(budget: float | None, start_rate: float | None = None) -> dict[str, Any]:
    """What each fleet is asked: the most samples/s within the request's budget, no target, any plan,
    solved to the end (as before issue 19: a value cut short by the request's clock would be wrong,
    not approximate), its fixed point from `start_rate`."""
    return {"objective": "throughput", "restricted": False, "budget": budget, "target": None, "bounded": False,
            "start_rate": start_rate}


def ask_ahead(search: Search, mode: Mode, budget: float | None, start_rate: float | None) -> Ahead | None:
    """Each kind of node's MILP submitted to the request's workers now (None without workers: they
    are solved at the end, in this process), each fixed point from `start_rate` (the fleet's best)."""
    if search.sims.workers == 1:
        return None
    q = _question(budget, start_rate)
    inherited = search.sims.inherited(search.cm)
    cm = search.cm if inherited is None else light_cost_model()  # named by id: the worker has it
    return {name: search.sims.submit(solve_job, SolveJob(None, mode, q["objective"], q["budget"], q["target"], 1,
                                                         search.solver, fleet=(cm, c, search.workload),
                                                         inherited=inherited, start_rate=start_rate))
            for name, (c, _) in _fleets(search.cluster).items()}


def _fleets(cluster: Cluster) -> dict[str, tuple[Cluster, int]]:
    """Kind of node -> the fleet with one more node of it, and that node's GPUs."""
    more: dict[str, tuple[Cluster, int]] = {}
    for i, group in enumerate(cluster.node_groups):
        name = group.gpu_type if group.label is None else f"{group.gpu_type}@{group.label}"
        if name in more:  # one more node of a kind already asked (identical groups plan as one pool)
            continue
        groups = list(cluster.node_groups)
        groups[i] = group.model_copy(update={"nodes": group.nodes + 1})
        more[name] = (cluster.model_copy(update={"node_groups": tuple(groups)}), group.gpus_per_node)
    return more


def marginal_values(search: Search, mode: Mode, budget: float | None, base: float | None = None,
                    ahead: Ahead | None = None) -> dict[str, float]:
    """Samples/s gained per GPU if each kind of node had one more (see the module docstring);
    `base`: the fleet's best if the caller already has it (the same MILP's answer), which is also
    where the kinds' fixed points start, as `ask_ahead` was given it (so the values are the same with
    workers or without; None: solved here, and the kinds start cold); `ahead`: the kinds' MILPs as
    `ask_ahead` submitted them."""
    start_rate = base
    if base is None:
        base = fleet_best(search, search.cluster, mode, budget)
    more = _fleets(search.cluster)
    if ahead is not None:
        answers = [ahead[name].result()[0] for name in more]
    else:
        answers = search.solve_many([(search.candidates(cluster=c), mode, 1, _question(budget, start_rate))
                                     for c, _ in more.values()])
    out: dict[str, float] = {}
    for (name, (_, per_node)), found in zip(more.items(), answers, strict=True):
        gain = (found[0].samples_per_s if found else 0.0) - base
        out[name] = float(np.round(max(gain, 0.0) / per_node, 6))
    return out
