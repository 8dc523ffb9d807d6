"""`rlfleet plan --framework areal|verl`: search only plans the framework launches as they are.

AReaL (one `rollout.backend`) and verl (one rollout pool, one TP) run one rollout engine kind, and
pin GPU types by whole nodes: AReaL through each role's Slurm nodelist, with one
`cluster.n_gpus_per_node`; verl through `rollout.nnodes x n_gpus_per_node`. So the search runs the
same MILP once per engine option, with that option's engines bought a whole node at a time (k =
GPUs per node / TP engines as one unit), and for AReaL only trainers on nodes of the same size.
The best of these is what the export writes, so the exported plan is the one simulated.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from planner.bounds import Deadline
from planner.candidates import Candidates, EngineOption
from planner.milp import Mode, Objective, Solution, solve

FRAMEWORKS = ("areal", "verl")
RULES = {
    "areal": "one rollout engine kind (one GPU type, one TP, no expert parallelism) on whole nodes of the "
             "trainer's node size",
    "verl": "one rollout engine kind (one GPU type, one TP) on whole nodes",
}
Solver = Callable[..., list[Solution]]  # planner.milp.solve's signature


def launches(framework: str, cand: Candidates, solution: Solution) -> bool:
    """Whether `framework` launches this allocation as it is (RULES): one engine kind on whole nodes
    (AReaL: no EP, and nodes of the trainer's size); the check every search under --framework keeps to."""
    kinds = {(o.pool, o.tp, o.ep) for o, n in solution.engines if n > 0}
    if len(kinds) != 1:
        return False
    pool, tp, ep = next(iter(kinds))
    per_node = cand.pools[pool].per_node
    engines = sum(n for _, n in solution.engines)
    if (engines * tp) % per_node:
        return False
    return framework != "areal" or (ep == 1 and cand.pools[solution.trainer.pool].per_node == per_node)


def _scaled(option: EngineOption, k: int) -> EngineOption:
    """k engines of `option` as one unit: k times the GPUs, price, batch and every segment's width."""
    return dataclasses.replace(option, tp=option.tp * k, samples_per_s=option.samples_per_s * k,
                               batch=option.batch * k, price_per_hour=option.price_per_hour * k,
                               segments=tuple((w * k, s) for w, s in option.segments))


def _unscaled(unit: EngineOption, k: int) -> EngineOption:
    return dataclasses.replace(unit, tp=unit.tp // k, samples_per_s=unit.samples_per_s / k, batch=unit.batch // k,
                               price_per_hour=unit.price_per_hour / k,
                               segments=tuple((w / k, s) for w, s in unit.segments))


def solver_for(framework: str) -> Solver:
    """planner.milp.solve restricted to the plans `framework` can launch (see the module docstring)."""
    if framework not in FRAMEWORKS:
        raise ValueError(f"unknown framework {framework!r}")

    def restricted(cand: Candidates, mode: Mode, objective: Objective, budget: float | None, target: float | None,
                   top_k: int, solver_name: str = "auto", deadline: Deadline | None = None,
                   start_rate: float | None = None) -> list[Solution]:
        if mode == "colocated":  # already one engine kind on the trainer's whole nodes
            return solve(cand, mode, objective, budget, target, top_k, solver_name, deadline)
        found: list[Solution] = []
        for option in cand.engines:
            if framework == "areal" and option.ep > 1:  # AReaL's rollout backend string has no EP
                continue
            pool = cand.pools[option.pool]
            k = pool.per_node // option.tp
            trainers = tuple(t for t in cand.trainers
                             if framework != "areal" or cand.pools[t.pool].per_node == pool.per_node)
            if not trainers:
                continue
            sub = dataclasses.replace(cand, engines=(_scaled(option, k),), trainers=trainers)
            for s in solve(sub, mode, objective, budget, target, top_k, solver_name, deadline, start_rate):
                found.append(dataclasses.replace(s, engines=tuple((_unscaled(o, k), n * k) for o, n in s.engines)))
        if objective == "throughput":
            found.sort(key=lambda s: (-s.samples_per_s, s.cost_per_hour))
        else:
            found.sort(key=lambda s: (s.cost_per_hour, -s.samples_per_s))
        # the best of each (engine kind, trainer pool) first: the analytic model ranks GPU-type swaps less
        # surely than sizes, and the simulator re-ranks only the top_k it is given
        leaders: dict[tuple[int, int, int, int], Solution] = {}
        for s in found:
            leaders.setdefault((s.engines[0][0].pool, s.engines[0][0].tp, s.engines[0][0].ep, s.trainer.pool), s)
        firsts = list(leaders.values())
        return (firsts + [s for s in found if s not in firsts])[:top_k]

    return restricted
