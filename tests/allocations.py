"""Every allocation of a small fleet, each placed and simulated: the simulator's best, for brute-force tests.

An allocation is a trainer option (planner.candidates: the fastest layout per pool and node count)
and, for each pool, either no engines or engines of its TPs filling its free GPUs (any mix of TPs,
whole engines inside a node): a fleet's GPUs all at work, or a pool's left out. Each is placed and
simulated exactly as the planner scores its own plans (planner.scoring.Search.score), so the best
of them is what the planner's answer is measured against.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass

from planner.bounds import Deadline
from planner.candidates import Candidates, EngineOption, TrainerOption, candidates
from planner.milp import Solution, evaluate
from planner.parallel import Simulations
from planner.scoring import Scored, Search, Trial
from traces import Cluster, CostModel, Workload
from traces.records import recommended_steps


def _fills(options: list[EngineOption], free: int) -> list[tuple[tuple[EngineOption, int], ...]]:
    """Every multiset of these engine options using exactly `free` GPUs."""
    out: list[tuple[tuple[EngineOption, int], ...]] = []

    def grow(i: int, left: int, chosen: tuple[tuple[EngineOption, int], ...]) -> None:
        if i == len(options):
            if left == 0:
                out.append(tuple((o, n) for o, n in chosen if n))
            return
        for n in range(left // options[i].tp + 1):
            grow(i + 1, left - n * options[i].tp, (*chosen, (options[i], n)))

    grow(0, free, ())
    return out


def allocations(cand: Candidates) -> Iterator[tuple[TrainerOption, tuple[tuple[EngineOption, int], ...]]]:
    for t in cand.trainers:
        per_pool = []
        for p in cand.pools:
            free = p.gpus - (t.nodes * p.per_node if p.index == t.pool else 0)
            per_pool.append([(), *_fills([o for o in cand.engines if o.pool == p.index], free)] if free else [()])
        for combo in itertools.product(*per_pool):
            engines = tuple(e for part in combo for e in part)
            if engines:
                yield t, engines


@dataclass(frozen=True)
class Enumerated:
    best: Scored
    count: int  # allocations simulated
    ranked: tuple[float, ...]  # every allocation's simulated samples/s, best first


def simulated_best(cm: CostModel, cluster: Cluster, workload: Workload, seed: int = 0,
                   settle: bool = True) -> Enumerated:
    """Every allocation (see the module docstring), simulated for the planner's default length and
    then, each of them, as a settling run (the figure the planner's answer is judged by,
    planner.confirm; `settle=False`: the screening figures alone)."""
    cand = candidates(cm, cluster, workload)
    steps = recommended_steps(workload.staleness if workload.mode == "async" else 0)
    # side by side on every core (planner.parallel: the answers a serial run gives, in order)
    search = Search(cm, cluster, workload, "throughput", None, None, "auto", steps, seed,
                    deadline=Deadline(seconds=math.inf, simulations=10**9), sims=Simulations(None))
    trials = []
    for t, engines in allocations(cand):
        rate, gen, train, tail, cost = evaluate(cand, t, engines, workload.mode)
        trials.append(Trial("allocation", cand, Solution(t, engines, rate, gen, train, tail, cost, math.nan, 0.0,
                                                        workload.mode)))
    search.sims.start(cm)
    try:
        scored = [s for s in search.score_many(trials, where="the brute force") if s is not None]
        if settle:
            scored = search.settle_many(scored, where="the brute force")
            assert all(s.confirmed for s in scored)
    finally:
        search.sims.close()
    ranked = sorted(scored, key=lambda s: -s.samples_per_s)
    return Enumerated(ranked[0], len(ranked), tuple(s.samples_per_s for s in ranked))
