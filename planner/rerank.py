"""Re-ranking by the simulator: the searches around the MILP's answers that the analytic model cannot settle.

- `without_slow_links`: per network-speed tier, the best plan without the slower nodes (weight sync
  waits for the slowest link to any engine, which the MILP prices once for the whole fleet).
- `refine_trainer`: a hill-climb on the trainer's size (a faster trainer also publishes weights
  sooner, which the analytic model sees only as a capacity).
- `explore_engines`: a hill-climb on the engine mix, one pool at a time: its engines all of one TP,
  or none of them, with the MILP's best counts for that restriction; or a share of one TP's engines
  re-cut into the next TP (the analytic model prefers low-TP engines for their samples/s per GPU;
  in simulation a long tail can favour a few higher-TP engines, or leaving slow engines out).
- `meet_target`: under a cost objective, re-solve with the analytic target raised by the simulated
  shortfall until a plan meets the target in simulation (settled: planner.confirm), or refuse in one line.
Each stops at the request's bounds (planner.bounds) and keeps what it found.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

from planner.candidates import Candidates, EngineOption
from planner.confirm import confirm
from planner.frameworks import launches
from planner.milp import Solution, evaluate
from planner.scoring import Scored, Search, Trial
from traces import SpecError

ANY = -1  # a pool's engines may be of any TP
NONE = 0  # a pool holds no engines


def climb(search: Search, ranked: tuple[Scored, ...], refine: int, explore: int) -> tuple[Scored, ...]:
    """The hill-climbs around the best plan of each candidate set (the fleet, and each network tier
    of it): the trainer's size, then the engine mix, then the size again if the mix moved. Climbing
    from each set's best (not only the overall best) makes the search of a fleet without its slow
    nodes part of the search of the whole fleet."""
    out = ranked
    # the fastest-linked subset first: the bound of simulated plans then spends on the search of a
    # fleet without its slow nodes before the whole fleet's, so adding slow nodes cannot cut it short
    for cand in reversed(list(dict.fromkeys(id(s.cand) for s in ranked))):
        mine = tuple(s for s in out if id(s.cand) == cand)
        known = len(mine)
        if refine > 0:
            mine = refine_trainer(search, mine, refine)
        if explore > 0:
            before = search.pick(mine)
            mine = explore_engines(search, mine, explore)
            if refine > 0 and search.pick(mine) is not before:  # a new engine mix: its trainer size again
                mine = refine_trainer(search, mine, refine)
        out = out + mine[known:]  # the climbs return what they were given first, then what they found
    return out


def without_slow_links(search: Search, top_k: int) -> list[tuple[Candidates, Solution]]:
    """The best plan that leaves out the nodes below each network speed, one per speed tier.

    Solving again without them (top_k, as the fleet is solved) makes the fleet's plans without its
    slow nodes always candidates: more nodes never make the plan worse."""
    speeds = sorted({g.inter_node_gb_per_s * 1e9 for g in search.cluster.node_groups}, reverse=True)
    out = []
    for floor in speeds[:-1]:
        if search.deadline.expired("the network-speed tiers"):
            break
        cand = search.candidates(min_link_bytes_per_s=floor)
        found = search.solve(cand, search.workload.mode, top_k) if cand.trainers else []
        out += [(cand, s) for s in found]
    return out


def refine_trainer(search: Search, ranked: tuple[Scored, ...], rounds: int) -> tuple[Scored, ...]:
    """Hill-climb on the trainer's size around the best simulated plan, one size step at a time.

    Each neighbour gets the MILP's best engines for it; the climb stops when no neighbour
    simulates better (at most `rounds` moves)."""
    out = list(ranked)
    seen = {(id(s.cand), s.solution.trainer.pool, s.solution.trainer.nodes) for s in ranked}
    best = search.pick(ranked)
    for _ in range(rounds):
        t, cand = best.solution.trainer, best.cand
        moved = False
        sizes = sorted(o.nodes for o in cand.trainers if o.pool == t.pool)
        i = sizes.index(t.nodes)
        near = set(sizes[max(0, i - 1):i + 2]) - {t.nodes}  # the next smaller and larger sizes
        options = [o for o in cand.trainers
                   if o.pool == t.pool and o.nodes in near and (id(cand), o.pool, o.nodes) not in seen]
        seen.update((id(cand), o.pool, o.nodes) for o in options)
        # a round's neighbours depend on its start alone: solved, then simulated, side by side
        near_rate = {"start_rate": best.solution.samples_per_s}  # the fixed points start near their answers
        answers = search.solve_many([(dataclasses.replace(cand, trainers=(o,)), best.solution.mode, 1, near_rate)
                                     for o in options])
        found = [a[0] for a in answers if a]
        first = len(out) - len(ranked) + 1
        every = search.score_many([Trial(f"refined-{first + j}", cand, sol) for j, sol in enumerate(found)],
                                  where="the trainer refinement")
        for scored in every:
            if scored is None:  # the request's bounds: keep what was found
                return tuple(out)
            out.append(scored)
            if search.pick((best, scored)) is scored:
                best, moved = scored, True
        if not moved:
            break
    return tuple(out)


def _allowed(option: EngineOption, state: dict[int, int]) -> bool:
    rule = state.get(option.pool, ANY)
    return rule == ANY or rule == option.tp


def _rule_moves(cand: Candidates, used: set[int], state: dict[int, int]) -> list[tuple[int, int]]:
    """(pool, rule) changes one pool at a time: each of its TPs alone, none (if it has engines now),
    or back to any TP."""
    out = []
    for pool in cand.pools:
        tps = sorted({o.tp for o in cand.engines if o.pool == pool.index})
        now = state.get(pool.index, ANY)
        rules = [tp for tp in tps if tp != now] if len(tps) > 1 else []  # one TP alone is any TP
        if pool.index in used and now != NONE:
            rules.append(NONE)
        if now != ANY:
            rules.append(ANY)
        out += [(pool.index, r) for r in dict.fromkeys(rules)]
    return out


MERGE_SHARE = 0.25  # a count move re-cuts about this share of a pool's GPUs of one TP (at least one engine)


def _count_moves(cand: Candidates, sol: Solution) -> list[Solution]:
    """The mix with some engines of one TP re-cut into engines of the next TP of their pool, up or
    down (a mixed-TP fleet: a few faster engines for the long tail), priced by the analytic model.
    The LP bound stays the MILP's; the gap is this allocation's distance to it."""
    options = {(o.pool, o.tp): o for o in cand.engines}
    counts: dict[tuple[int, int], int] = {}
    for o, n in sol.engines:
        counts[(o.pool, o.tp)] = counts.get((o.pool, o.tp), 0) + n
    out = []
    for pool in sorted({p for p, _ in counts}):
        tps = sorted(tp for p, tp in options if p == pool)
        for a, b in itertools.pairwise(tps):
            for src, dst in ((a, b), (b, a)):
                have = counts.get((pool, src), 0)
                gpus = max(max(a, b), round(MERGE_SHARE * have * src / b) * b)  # whole engines of both sizes
                if have * src < gpus:
                    continue
                mix = dict(counts)
                mix[(pool, src)] = have - gpus // src
                mix[(pool, dst)] = mix.get((pool, dst), 0) + gpus // dst
                engines = tuple((options[k], n) for k, n in sorted(mix.items()) if n > 0)
                rate, gen, train, tail, cost = evaluate(cand, sol.trainer, engines, sol.mode)
                bound = sol.lp_bound
                gap = max(0.0, (bound - rate) / bound) if math.isfinite(bound) and bound > 0 else sol.gap
                out.append(Solution(sol.trainer, engines, rate, gen, train, tail, cost, bound, gap, sol.mode))
    return out


def _kind_moves(cand: Candidates, sol: Solution) -> list[Solution]:
    """Moves of a one-kind plan that stay one kind on whole nodes (what --framework launches): the
    same GPUs re-cut into each other TP of the pool, or one node of engines more or fewer; each
    priced by the analytic model at the plan's period (EngineOption.derated), as the MILP prices it."""
    (option, count), = sol.engines
    pool = cand.pools[option.pool]
    trainer_gpus = sol.trainer.nodes * pool.per_node if sol.trainer.pool == pool.index else 0
    period = cand.samples_per_step / sol.samples_per_s if sol.samples_per_s > 0 else math.inf
    kinds = {o.tp: o for o in cand.engines if o.pool == option.pool and o.ep == option.ep}
    gpus = count * option.tp
    mixes = [(o, gpus // tp) for tp, o in kinds.items() if tp != option.tp and gpus % tp == 0]
    step = pool.per_node // option.tp
    mixes += [(kinds[option.tp], n) for n in (count - step, count + step)
              if option.tp in kinds and n > 0 and n * option.tp + trainer_gpus <= pool.gpus]
    out = []
    for o, n in mixes:
        engines = ((o.derated(period), n),)
        rate, gen, train, tail, cost = evaluate(cand, sol.trainer, engines, sol.mode)
        bound = sol.lp_bound
        gap = max(0.0, (bound - rate) / bound) if math.isfinite(bound) and bound > 0 else sol.gap
        out.append(Solution(sol.trainer, engines, rate, gen, train, tail, cost, bound, gap, sol.mode))
    return out


def explore_engines(search: Search, ranked: tuple[Scored, ...], rounds: int) -> tuple[Scored, ...]:
    """Hill-climb on the engine mix of the best simulated plan (see the module docstring): at each
    round every one-pool change of the rules is solved with the plan's trainer, every count move
    (`_count_moves`) is priced, and each is simulated; the best improvement is kept, up to `rounds`
    moves. Under --framework the count moves are those that keep one engine kind on whole nodes
    (`_kind_moves`), and every move is checked against what the framework launches
    (planner.frameworks.launches): the rule moves are solved by the framework's restricted solver."""
    out = list(ranked)
    best = search.pick(ranked)
    state: dict[int, int] = {}
    for _ in range(rounds):
        cand, trainer, mode = best.cand, best.solution.trainer, best.solution.mode
        used = {o.pool for o, _ in best.solution.engines}
        start, chosen = best, state
        moves = []
        for pool, rule in _rule_moves(cand, used, state):
            trial = {**state, pool: rule}
            engines = tuple(o for o in cand.engines if _allowed(o, trial))
            if not engines or search.deadline.expired("the engine-mix search"):
                continue
            moves.append((trial, dataclasses.replace(cand, engines=engines, trainers=(trainer,))))
        near_rate = {"start_rate": start.solution.samples_per_s}  # the fixed points start near their answers
        answers = search.solve_many([(c, mode, 1, near_rate) for _, c in moves])  # independent MILPs side by side
        trials: list[tuple[dict[int, int], Solution | None]] = [
            (trial, found[0] if found else None) for (trial, _), found in zip(moves, answers, strict=True)]
        framework = search.framework
        if framework is None:
            trials += [(state, s) for s in _count_moves(cand, start.solution)]
        elif len(start.solution.engines) == 1 and mode != "colocated":
            trials += [(state, s) for s in _kind_moves(cand, start.solution)]
        live = [(trial, sol) for trial, sol in trials
                if sol is not None and (framework is None or launches(framework, cand, sol))]
        first = len(out) - len(ranked) + 1
        every = search.score_many([Trial(f"mix-{first + j}", cand, sol) for j, (_, sol) in enumerate(live)],
                                  where="the engine-mix search")  # one round's trials side by side
        for (trial, _), scored in zip(live, every, strict=True):
            if scored is None:
                return tuple(out)
            out.append(scored)
            if search.pick((best, scored)) is scored and scored.samples_per_s != best.samples_per_s:
                best, chosen = scored, trial
        if best is start:
            break
        state = chosen
    return tuple(out)


def meet_target(search: Search, ranked: tuple[Scored, ...], top_k: int, rounds: int = 4) -> tuple[Scored, ...]:
    """Cost objective: re-solve with the analytic target raised by the simulated shortfall until a
    plan meets the target in simulation (its settled figure: planner.confirm), or SpecError (one
    line, with the best found) if none does."""
    target = search.target
    assert target is not None, "a cost objective has a target (planner.explain.check_request)"
    out, asked = list(ranked), target
    for _ in range(rounds):
        out = list(confirm(search, tuple(out), where="the cost target's settling runs"))
        judged = _judged(search, out)
        if any(s.samples_per_s >= target for s in judged):
            return tuple(out)
        best = max(judged, key=lambda s: s.samples_per_s / max(s.solution.samples_per_s, 1e-12))
        ratio = best.samples_per_s / best.solution.samples_per_s if best.solution.samples_per_s > 0 else 0.0
        asked = max(asked * 1.05, target / ratio if ratio > 0 else math.inf)
        if not math.isfinite(asked) or search.deadline.expired("the cost target's re-solves"):
            break
        found = search.solve(best.cand, best.solution.mode, top_k, objective="cost", target=asked)
        if not found:
            break
        more = [search.score(f"target-{len(out) + 1}", best.cand, s, where="the cost target's re-solves")
                for s in found]
        out.extend(s for s in more if s is not None)
        if None in more:
            break
    out = list(confirm(search, tuple(out), where="the cost target's settling runs"))
    judged = _judged(search, out)
    if any(s.samples_per_s >= target for s in judged):
        return tuple(out)
    top = max(judged, key=lambda s: s.samples_per_s)
    bound = f" ({search.deadline.hit})" if search.deadline.hit else ""
    raise SpecError(f"no plan meets the target of {target:g} samples/s in simulation: the best found reaches "
                    f"{top.samples_per_s:.1f} at ${top.solution.cost_per_hour:,.2f}/h{bound}; lower --target, raise "
                    "--budget or add GPUs")


def _judged(search: Search, out: list[Scored]) -> list[Scored]:
    """The plans a target is judged on: the settled ones (all, when settling is off or none settled)."""
    return [s for s in out if s.confirmed] or out
