"""How far the MILP's analytic throughput is from the simulator's, over random fleets.

For N random fleets (2-3 GPU types, 16-64 GPUs, long-tailed or fixed lengths, async or sync, a few
models), plans the MILP's best allocation, places it, reprices its weight sync on the placed links
(as the planner does), prices it by the simulator's routing and update rules (planner.rate_model.raced:
interruptible engines at their routed loads, the others and on-policy plans by the race of
planner.tail_model.race; the MILP still ranks on its slopes) and simulates it for warm-up + whole steady periods
(traces.records.recommended_steps). Prints the ratio analytic / simulated per fleet, then the
median and the worst (the further from 1, the more the MILP ranks plans on a wrong model), and the
worst fleets again with their placed plans (trainer, engines), to find what the model misses, and
the geometric mean of the chosen plans' simulated samples/s (a better analytic model must not pick
worse plans).
`--compare REV` also runs this bench as it is at git revision REV (a temporary git worktree, in a
subprocess, same fleets and seed) and prints both models side by side: ratios and chosen plans.
`--settled` simulates each plan until its steady rate settles (sim.simulate(until_settled=True), the
rule of traces.records.settled, at most traces.records.settle_cap steps) instead of the short
recommended window, which can under- or over-state a long tail's steady rate (GRPO groups finishing
in waves longer than the window); with --compare it runs this file against REV's planner and simulator.
Usage: python bench/analytic_vs_sim.py [--fleets 50] [--seed 0] [--steps N] [--worst 8] [--compare REV]
       [--settled] [--sim-seeds K] [--more-seeds K]
`--sim-seeds K` takes the simulated figure as the mean of K whole settle-cap runs (seeds 0 .. K-1, no early
stop; it overrides --settled): one settled run can stop inside a passing regime (seed 1 #47 settled at 58
samples/s where whole runs give 29-33).
`--more-seeds K` also runs K further seeds and prints one summary line each, then all pooled: one
seed's worst fleet is one draw of the model's misses.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from planner.candidates import Candidates, candidates
from planner.milp import Solution, solve
from planner.placement import reprice_sync, to_plan
from sim import simulate
from traces import Cluster, CostModel, Workload, get_model
from traces.lengths import LengthDist
from traces.records import recommended_steps, settle_cap

try:  # --settled --compare runs this file against older revisions, which price without the race
    from planner.milp import raced
except ImportError:  # pragma: no cover - older revisions only
    def raced(cand: Candidates, sol: Solution) -> Solution:
        return sol

TYPES = ["H100", "H800", "H20", "A100-80G", "L40S", "H200"]
MODELS = ["qwen2.5-1.5b", "qwen2.5-7b", "llama-3.1-8b"]


def random_case(rng: random.Random) -> tuple[Cluster, Workload]:
    types = rng.sample(TYPES, rng.choice([2, 3]))
    groups = tuple({"gpu_type": t, "nodes": rng.choice([1, 2, 3]), "gpus_per_node": 8,
                    "inter_node_gb_per_s": rng.choice([12.5, 25.0, 50.0])} for t in types)
    mode = rng.choice(["async", "async", "sync"])
    if rng.random() < 0.7:
        response = LengthDist(kind="lognormal", mean=rng.choice([600, 1500, 3000]), sigma=rng.choice([0.6, 1.0]),
                              cap=rng.choice([4096, 8192]))
    else:
        response = LengthDist(kind="fixed", value=rng.choice([512, 1024, 2048]))
    w = Workload(name="random", model=get_model(rng.choice(MODELS)), prompts_per_step=rng.choice([16, 32, 64]),
                 group_size=rng.choice([8, 16]), prompt_len=LengthDist(kind="uniform", low=64, high=512),
                 response_len=response, mode=mode, staleness=rng.choice([1, 2, 4]) if mode == "async" else 0,
                 interruptible=rng.random() < 0.5, ppo_minibatches=rng.choice([1, 4]))
    return Cluster(name="random", node_groups=groups), w


def ratio(cm: CostModel, cluster: Cluster, w: Workload, steps: int | None, settled: bool = False,
          sim_seeds: int = 0) -> tuple[float, float, str, str] | None:
    cand = candidates(cm, cluster, w)
    found = solve(cand, w.mode, "throughput", None, None, 1, "auto")
    if not found:
        return None
    plan = to_plan(cluster, w, cand, found[0])
    sol = raced(cand, reprice_sync(cm, cluster, w, cand, found[0], plan))
    eta = w.staleness if w.mode == "async" else 0
    n = steps or (settle_cap(eta) if settled or sim_seeds else recommended_steps(eta))
    if sim_seeds:  # the mean steady rate of whole capped runs: one run can settle in a passing regime
        simulated = statistics.mean(simulate(cluster, w, plan, cm, steps=n, seed=k, record_queue=False).samples_per_s
                                    for k in range(sim_seeds))
    else:
        simulated = simulate(cluster, w, plan, cm, steps=n, seed=0, record_queue=False,
                             until_settled=settled).samples_per_s
    mix = " ".join(f"{g.instances}x{g.gpu_type}-tp{g.tp}" for g in plan.rollout)
    placed = f"trainer {len(plan.trainer.nodes)} {plan.trainer.gpu_type} node(s); engines {mix}"
    return sol.samples_per_s, simulated, sol.bottleneck, placed


ROW = re.compile(r"^\s*(\d+) .*? (\d+\.\d\d)\s+(\d+\.\d\d)\s+\d+\.\d\d [a-z]")  # a fleet's row, as printed


def geomean(values: list[float]) -> float:
    return math.exp(statistics.mean(math.log(v) for v in values)) if values and min(values) > 0 else 0.0


def summary(ratios: list[float]) -> str:
    off = [abs(r - 1) for r in ratios]
    return (f"median {statistics.median(ratios):.3f}, median |ratio - 1| {statistics.median(off):.1%}, worst "
            f"{max(ratios, key=lambda r: abs(r - 1)):.2f} (|ratio - 1| {max(off):.1%}; "
            f"{sum(o > 0.2 for o in off)} beyond 20%)")


def at_revision(rev: str, args: argparse.Namespace) -> dict[int, tuple[float, float]]:
    """This bench as it is at git revision `rev`, same fleets: fleet -> (analytic, simulated)."""
    root = Path(subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                               check=True).stdout.strip())
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "old"
        subprocess.run(["git", "-C", str(root), "worktree", "add", "--detach", str(tree), rev], check=True,
                       capture_output=True)
        try:
            script = str(Path(__file__).resolve()) if args.settled else "bench/analytic_vs_sim.py"
            cmd = [sys.executable, script, "--fleets", str(args.fleets), "--seed",
                   str(args.seed), "--worst", "0"] + (["--steps", str(args.steps)] if args.steps else []) + (
                       ["--settled"] if args.settled else [])
            out = subprocess.run(cmd, cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True,
                                 text=True, check=True).stdout
        finally:
            subprocess.run(["git", "-C", str(root), "worktree", "remove", "--force", str(tree)], check=False,
                           capture_output=True)
    rows: dict[int, tuple[float, float]] = {}
    for line in out.splitlines():
        m = ROW.match(line)
        if m and int(m.group(1)) not in rows:
            rows[int(m.group(1))] = (float(m.group(2)), float(m.group(3)))
    return rows


def fleets(cm: CostModel, seed: int, args: argparse.Namespace, show: bool
           ) -> tuple[dict[int, tuple[float, float]], list[tuple[float, str, str, str]]]:
    """The fleets of one seed: fleet -> (analytic, simulated), and (|ratio - 1|, row, plan, kind) rows."""
    rng = random.Random(seed)
    found: dict[int, tuple[float, float]] = {}
    rows: list[tuple[float, str, str, str]] = []
    for i in range(args.fleets):
        cluster, w = random_case(rng)
        got = ratio(cm, cluster, w, args.steps, args.settled, args.sim_seeds)
        if got is None:
            continue
        analytic, simulated, bottleneck, placed = got
        r = analytic / simulated if simulated > 0 else float("inf")
        found[i] = (analytic, simulated)
        types = "+".join(f"{g.nodes * g.gpus_per_node}{g.gpu_type}" for g in cluster.node_groups)
        rl = w.response_len
        lengths = f"{rl.kind} {rl.expected():.0f}/{rl.max}"
        line = (f"{i:>3} {types:<22} {w.model.name:<13} {w.mode:<5} {w.staleness:>3} {lengths:<16} "
                f"{analytic:9.2f} {simulated:9.2f} {r:6.2f} {bottleneck}")
        if show:
            print(line)
        kind = "not interruptible" if w.mode == "async" and not w.interruptible else \
            "interruptible" if w.mode == "async" else "on-policy"
        rows.append((abs(r - 1), line, placed, kind))
    return found, rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fleets", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=None, help="trainer steps per simulation (default: recommended)")
    ap.add_argument("--worst", type=int, default=8, help="print this many worst fleets with their plans")
    ap.add_argument("--compare", metavar="REV", help="also run the bench at this git revision, side by side")
    ap.add_argument("--settled", action="store_true", help="simulate until the steady rate settles")
    ap.add_argument("--sim-seeds", type=int, default=0, metavar="K",
                    help="simulate each plan with seeds 0 .. K-1 for the whole settling cap and take the mean rate")
    ap.add_argument("--more-seeds", type=int, default=0, metavar="K",
                    help="also summarise seeds seed+1 .. seed+K (50 more fleets each), and all of them pooled")
    args = ap.parse_args()
    t_old = time.perf_counter()
    old = at_revision(args.compare, args) if args.compare else {}
    t_old = time.perf_counter() - t_old
    cm = CostModel()
    print(f"{'#':>3} {'types':<22} {'model':<13} {'mode':<5} {'eta':>3} {'lengths':<16} "
          f"{'analytic':>9} {'simulated':>9} {'ratio':>6} bottleneck")
    t0 = time.perf_counter()
    found, rows = fleets(cm, args.seed, args, show=True)
    elapsed = time.perf_counter() - t0
    print(f"\nthe {args.worst} furthest from 1 (where the analytic model is wrong), with their plans:")
    for _, line, placed, kind in sorted(rows, reverse=True)[:args.worst]:
        print(f"{line}\n      {placed}; {kind}")
    ratios = [a / s for a, s in found.values()]
    print(f"\n{len(ratios)} fleets in {elapsed:.0f} s: analytic/simulated {summary(ratios)}; chosen plans' "
          f"simulated samples/s, geometric mean {geomean([s for _, s in found.values()]):.3f}")
    pooled = list(ratios)
    for seed in range(args.seed + 1, args.seed + 1 + args.more_seeds):  # is seed 0's worst a fair sample?
        more, _ = fleets(cm, seed, args, show=False)
        pooled += [a / s for a, s in more.values()]
        print(f"seed {seed}: {len(more)} fleets, {summary([a / s for a, s in more.values()])}")
    if args.more_seeds:
        print(f"all {args.more_seeds + 1} seeds, {len(pooled)} fleets: {summary(pooled)}")
    if args.compare:
        both = sorted(set(old) & set(found))
        print(f"\nside by side with {args.compare} ({len(both)} fleets both planned; it ran in {t_old:.0f} s):")
        print(f"{'#':>3} {'ratio ' + args.compare[:10]:>17} {'ratio now':>10} {'simulated then':>15} {'now':>8}")
        for i in both:
            (a0, s0), (a1, s1) = old[i], found[i]
            print(f"{i:>3} {a0 / s0:17.2f} {a1 / s1:10.2f} {s0:15.2f} {s1:8.2f}")
        print(f"{args.compare}: {summary([old[i][0] / old[i][1] for i in both])}; chosen plans' geometric mean "
              f"{geomean([old[i][1] for i in both]):.3f}")
        print(f"now: {summary([found[i][0] / found[i][1] for i in both])}; chosen plans' geometric mean "
              f"{geomean([found[i][1] for i in both]):.3f}")


if __name__ == "__main__":
    main()
