"""Check that a change to the simulator leaves its results alone: this tree against another one.

Runs ~30 plans (the fast-vs-token scenarios of tests/test_sim.py over seeds and staleness bounds,
KV-preemption-heavy plans, a few steps of the 1024-GPU bench plan) in both trees, each in its own
process, and compares summaries, step times, trained ids, timelines and queue series: integers and
strings exactly, floats to a relative 1e-9. Usage:

    git archive main | tar -x -C /tmp/base
    python bench/sim_compare.py /tmp/base   # or a pickle that `--run FILE` saved in the base tree

With --speed N it times instead: bench/sim_speed.py's 50-step plan in the two trees, one process
after the other, N rounds of three runs each (after a 1-step warm-up in each process), and prints
each tree's best and median wall and CPU seconds (a shared machine's load drifts: alternating keeps
the comparison fair).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pickle
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REL = 1e-9


def cases() -> dict[str, tuple[Any, ...]]:
    """name -> (cluster, workload, plan, steps, seed, record_queue)."""
    from bench import small_fleet
    from bench.sim_speed import CLUSTER as BENCH_CLUSTER
    from bench.sim_speed import PLAN as BENCH_PLAN
    from bench.sim_speed import WORKLOAD as BENCH_WORKLOAD
    from traces import Cluster, Plan, RolloutGroup, TrainerGroup, example_cluster, get_model
    from traces.agentic import Agentic, SecondsDist
    from traces.lengths import LengthDist
    from traces.workload import DynamicSampling, Workload

    cluster = example_cluster("mixed-h800-h20-l40s")
    fixed = LengthDist(kind="fixed", value=600)
    longtail = LengthDist(kind="lognormal", mean=800, sigma=1.0, cap=4096)

    def workload(resp: LengthDist, mode: str, eta: int, interruptible: bool, prompts: int = 16, group: int = 8,
                 model: str = "qwen2.5-1.5b", reward: float = 0.01, **extra: Any) -> Workload:
        return Workload(model=get_model(model), prompts_per_step=prompts, group_size=group,
                        prompt_len=LengthDist(kind="uniform", low=64, high=256), response_len=resp, mode=mode,
                        staleness=eta if mode == "async" else 0, interruptible=interruptible, reward_seconds=reward,
                        **extra)

    def plan(mode: str, eta: int, engines: int = 4, gen: str = "H20") -> Plan:
        if mode == "colocated":
            return Plan(mode=mode, rollout=(RolloutGroup(gpu_type="H800", tp=1, instances=8),),
                        trainer=TrainerGroup(gpu_type="H800", dp=8))
        return Plan(mode=mode, staleness=eta if mode == "async" else 0,
                    rollout=(RolloutGroup(gpu_type=gen, tp=1, instances=engines),),
                    trainer=TrainerGroup(gpu_type="H800", dp=8))

    out: dict[str, tuple[Any, ...]] = {}
    scenarios = {
        "async-fixed": (fixed, "async", True), "async-longtail": (longtail, "async", True),
        "async-longtail-nonint": (longtail, "async", False), "sync-fixed": (fixed, "sync", False),
        "sync-longtail": (longtail, "sync", False), "colocated-fixed": (fixed, "colocated", False),
        "colocated-longtail": (longtail, "colocated", False),
    }
    for name, (resp, mode, interruptible) in scenarios.items():
        etas = (0, 2, 4) if mode == "async" else (0,)
        for eta in etas:
            for seed in (3, 11):
                out[f"{name}-eta{eta}-s{seed}"] = (cluster, workload(resp, mode, eta, interruptible),
                                                   plan(mode, eta), 5, seed, True)
    # KV-bound: 7b on two L40S engines with long responses, many samples each -> recompute preemption
    heavy = LengthDist(kind="lognormal", mean=3000, sigma=0.8, cap=16384)
    kv_cluster = Cluster(node_groups=({"gpu_type": "H800", "nodes": 1}, {"gpu_type": "L40S", "nodes": 1}))
    for interruptible in (True, False):
        for seed in (0, 5):
            out[f"kv-heavy-int{int(interruptible)}-s{seed}"] = (
                kv_cluster, workload(heavy, "async", 2, interruptible, prompts=64, group=16, model="qwen2.5-7b",
                                     reward=0.0 if seed else 0.05),
                plan("async", 2, engines=2, gen="L40S"), 4, seed, True)
    mixed = Plan(mode="async", staleness=1, trainer=TrainerGroup(gpu_type="H800", dp=8),
                 rollout=(RolloutGroup(gpu_type="H20", instances=4), RolloutGroup(gpu_type="L40S", instances=4)))
    out["mixed-fleet"] = (cluster, workload(longtail, "async", 1, True, prompts=96, model="qwen2.5-7b"), mixed, 6, 1,
                          True)
    out["bench-3steps"] = (BENCH_CLUSTER, BENCH_WORKLOAD, BENCH_PLAN, 3, 0, False)
    # the controller's other paths: DAPO's dynamic sampling (drops free allowance), streaming chunks, agentic
    # episodes (tool calls file their turns apart)
    for name, extra in {"dapo": {"dynamic_sampling": DynamicSampling(pass_rate=0.5, oversample=2)},
                        "stream": {"stream_chunks": 4, "ppo_minibatches": 4},
                        "agentic": {"agentic": Agentic(
                            turns=LengthDist(kind="uniform", low=1, high=4),
                            tool_latency=SecondsDist(kind="lognormal", mean=2.0, sigma=1.0, cap=30.0),
                            tool_tokens=LengthDist(kind="lognormal", mean=200, sigma=1.0, cap=1024))}}.items():
        out[f"{name}-async-eta2"] = (cluster, workload(longtail, "async", 2, True, **extra), plan("async", 2), 5, 3,
                                     True)
    # small busy fleets (bench/small_fleet.py, issue 19): one completion at a time, on the per-engine path
    for name, case in small_fleet.CASES.items():
        for seed in (0, 7):
            out[f"small-{name}-s{seed}"] = (*case(), 5, seed, True)
    return out


def run_all(dest: str) -> None:
    """Run every case in this interpreter's tree and pickle plain results to `dest`."""
    from sim import simulate
    from traces import CostModel

    cm = CostModel.roofline_only()
    results: dict[str, Any] = {}
    for name, (cluster, w, p, steps, seed, queue) in cases().items():
        t0 = time.perf_counter()
        r = simulate(cluster, w, p, cm, steps=steps, seed=seed, record_queue=queue)
        results[name] = {"summary": r.summary(), "step_times": r.step_times,
                         "trained_ids": np.asarray(r.trained_ids).tolist(), "admitted": r.admitted,
                         "timeline": r.timeline_rows, "queue": r.queue_rows,
                         "wall": time.perf_counter() - t0}
    with open(dest, "wb") as f:
        pickle.dump(results, f)


def same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return a == b or math.isclose(a, b, rel_tol=REL, abs_tol=1e-12)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def results_of(tree: Path) -> dict[str, Any]:
    if tree.suffix == ".pkl":  # results saved by an earlier --run
        with open(tree, "rb") as f:
            return pickle.load(f)
    with tempfile.NamedTemporaryFile(suffix=".pkl", delete=False) as f:
        dest = f.name
    env = {**os.environ, "PYTHONPATH": str(tree)}
    subprocess.run([sys.executable, str(Path(__file__).resolve()), "--run", dest], check=True, env=env, cwd=tree)
    with open(dest, "rb") as f:
        return pickle.load(f)


TIMING = """
import json
from bench.sim_speed import timed
timed(1, token_level=False)  # the process's first simulation loads the compiled kernels: not measured
print(json.dumps([timed(50, token_level=False) for _ in range(3)]))
"""


def speed(trees: dict[str, Path], rounds: int) -> None:
    """Time the bench plan in each tree, alternating processes, and print best and median figures."""
    runs: dict[str, list[tuple[float, float, int, float]]] = {name: [] for name in trees}  # sim_speed.timed's
    for r in range(rounds):
        for name in (list(trees) if r % 2 == 0 else list(trees)[::-1]):
            env = {**os.environ, "PYTHONPATH": str(trees[name])}
            out = subprocess.run([sys.executable, "-c", TIMING], check=True, env=env, cwd=trees[name],
                                 capture_output=True, text=True).stdout
            runs[name] += [tuple(x) for x in json.loads(out)]  # type: ignore[misc]
    for name, rs in runs.items():
        walls, cpus = sorted(x[0] for x in rs), sorted(x[3] for x in rs)
        sim_s, events = rs[0][1], rs[0][2]
        mid = len(rs) // 2
        wall = f"wall best {walls[0]:.3f} s median {walls[mid]:.3f} s"
        cpu = f"cpu best {cpus[0]:.3f} s median {cpus[mid]:.3f} s"
        rates = (f"{sim_s / walls[0]:,.0f} (median {sim_s / walls[mid]:,.0f}) simulated s per wall s, "
                 f"{sim_s / cpus[0]:,.0f} (median {sim_s / cpus[mid]:,.0f}) per cpu s, "
                 f"{events / walls[mid]:,.0f} events per wall s (median)")
        print(f"{name:5s} {len(rs)} runs: {wall}, {cpu}; {sim_s:,.0f} simulated s, {events} events: {rates}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base", nargs="?", help="the other tree (e.g. main exported with git archive)")
    ap.add_argument("--run", help=argparse.SUPPRESS)
    ap.add_argument("--speed", type=int, metavar="ROUNDS", help="time the bench plan in both trees instead")
    args = ap.parse_args()
    if args.run:
        run_all(args.run)
        return
    here = Path(__file__).resolve().parent.parent
    if args.speed:
        speed({"base": Path(args.base), "new": here}, args.speed)
        return
    base, new = results_of(Path(args.base)), results_of(here)
    bad = 0
    for name in base:
        b, n = base[name], new[name]
        b["timeline"], n["timeline"] = sorted(b["timeline"]), sorted(n["timeline"])  # ties may come in any order
        diffs = [k for k in ("summary", "step_times", "trained_ids", "admitted", "timeline", "queue")
                 if not same(b[k], n[k])]
        bad += bool(diffs)
        print(f"{'OK  ' if not diffs else 'DIFF'} {name:38s} base {b['wall']:6.2f} s  new {n['wall']:6.2f} s"
              f"  events {b['summary']['events']}->{n['summary']['events']} {' '.join(diffs)}")
    print(f"{len(base) - bad}/{len(base)} runs identical (floats to rel {REL})")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
