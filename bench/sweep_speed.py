"""A 64-variant what-if sweep run serially, in local processes and on a local Ray, side by side in one run.

The sweep: a two-node fleet (one H800 node, one H20 node) and the shipped short-answer math job on
qwen2.5-1.5b at 16 prompts x 8 samples a step; 63 variants (H20 nodes added 0-3 x staleness 0-3 x
budget none/$20/$30/$40 per hour, less the unchanged one) after the baseline row. Each variant is
planned as `rlfleet plan` plans it (MILP, simulated re-ranking and refinement, no baselines), with
`--sim-steps` trainer steps per simulation: about a second and a half each on a quiet core.

Prints wall seconds per executor (best and median of --repeat alternating rounds) and the speed-up
over serial, and checks that every table equals the serial one exactly. The first processes sweep
starts the worker pool (later sweeps of the process reuse it); the local Ray is started once before
the rounds and its start is printed apart (a cluster is started once and serves many sweeps). The
machine may be shared: the load average is printed with the figures.
Usage: python bench/sweep_speed.py [--sim-steps 4] [--repeat 1] [--workers N]
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import time

import pandas as pd

from planner.executors import Executor, cores
from planner.sweeps import Change, what_if
from traces import Cluster, example_workload
from traces.ray_address import LOOPBACK_ENV


def variants() -> list[Change]:
    """63 changes: the grid below less its all-unchanged corner (the sweep's baseline row)."""
    out = []
    for h20, eta, budget in itertools.product((0, 8, 16, 24), (0, 1, 2, 3), (None, 20.0, 30.0, 40.0)):
        if (h20, eta, budget) == (0, 1, None):  # the shipped job's own staleness: the baseline
            continue
        out.append(Change(f"+{h20} H20, eta {eta}, budget {budget or 'none'}", gpus={"H20": h20} if h20 else {},
                          workload={"staleness": eta}, budget=budget))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sim-steps", type=int, default=4, help="trainer steps per simulation (default 4)")
    ap.add_argument("--repeat", type=int, default=1, help="rounds of the three sweeps (best and median)")
    ap.add_argument("--workers", type=int, default=None, help="processes / Ray CPUs (default: the cores here)")
    args = ap.parse_args()
    cluster = Cluster(name="h800-h20-2node", node_groups=({"gpu_type": "H800", "nodes": 1},
                                                          {"gpu_type": "H20", "nodes": 1}))
    workload = example_workload("qwen2.5-1.5b-math-short").model_copy(update={"prompts_per_step": 16,
                                                                              "group_size": 8})
    changes = variants()
    workers = args.workers or cores()
    print(f"what-if sweep: {len(changes) + 1} variants of {cluster.name} x {workload.name}, "
          f"{workload.samples_per_step} samples a step, {args.sim_steps} sim steps each; {cores()} cores, "
          f"{workers} workers, load average "
          f"{os.getloadavg()[0]:.1f} at start")

    def sweep(executor: Executor) -> tuple[pd.DataFrame, float]:
        t0 = time.perf_counter()
        frame = what_if(cluster, workload, changes, sim_steps=args.sim_steps, executor=executor)
        return frame, time.perf_counter() - t0

    os.environ.setdefault(LOOPBACK_ENV, "0")
    import ray

    t0 = time.perf_counter()
    ray.init(address="local", num_cpus=workers, include_dashboard=False, log_to_driver=False,
             object_store_memory=256 * 1024**2)
    ray_start_s = time.perf_counter() - t0
    executors = {"serial": Executor("serial"), "processes": Executor("processes", workers=workers),
                 "ray (local)": Executor("ray")}
    seconds: dict[str, list[float]] = {name: [] for name in executors}
    reference, same = None, True
    for _ in range(max(1, args.repeat)):  # the executors alternate, so a change of load hits all three
        for name, executor in executors.items():
            frame, wall = sweep(executor)
            seconds[name].append(wall)
            reference = frame if reference is None else reference
            same = same and frame.equals(reference)
            print(f"  {name}: {wall:.1f} s, same table as serial: {'yes' if frame.equals(reference) else 'NO'}")
    ray.shutdown()
    serial_s = min(seconds["serial"])
    print(f"{'executor':<14}{'best s':>8}{'median s':>10}{'speed-up (best)':>17}")
    for name, walls in seconds.items():
        print(f"{name:<14}{min(walls):8.1f}{statistics.median(walls):10.1f}{serial_s / min(walls):16.2f}x")
    print(f"first processes sweep includes starting the pool ({workers} spawned workers: imports, compiled "
          f"kernels); the local Ray's start, {ray_start_s:.1f} s, is in no row; load average "
          f"{os.getloadavg()[0]:.1f} at the end")
    ok = sum(1 for note in reference.note if not note)
    print(f"{ok} of {len(reference)} variants planned; best {reference.samples_per_s.max():.2f} samples/s "
          f"({reference.loc[reference.samples_per_s.idxmax(), 'variant']})")
    if not same:
        raise SystemExit("the executors' tables differ")


if __name__ == "__main__":
    main()
