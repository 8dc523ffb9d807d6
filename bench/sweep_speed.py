"""A 64-variant what-if sweep run serially, in local processes and on a local Ray, side by side in one run.

The sweep: a two-node fleet (one H800 node, one H20 node) and the shipped short-answer math job on
qwen2.5-1.5b at 16 prompts x 8 samples a step; 63 variants (H20 nodes added 0-3 x staleness 0-3 x
budget none/$20/$30/$40 per hour, less the unchanged one) after the baseline row. Each variant is
planned as `rlfleet plan` plans it (MILP, simulated re-ranking and refinement, no baselines), with
`--sim-steps` trainer steps per simulation: about 0.6 CPU seconds a variant, measured here.

Prints wall seconds per executor (best and median of --repeat alternating rounds), the speed-up over
serial, and the CPU seconds every process of the sweep used, so the cores it got: on a machine that
others share, and under Linux's per-session autogroup scheduling, a sweep's workers share one session's
CPU and the wall-clock speed-up stays near 1 whatever the executor. Checks that every table equals the
serial one exactly. The first processes sweep starts the worker pool (later sweeps of the process
reuse it); the local Ray is started once before the rounds and its start is printed apart (a cluster
is started once and serves many sweeps).
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


def tree_cpu_seconds(root: int | None = None) -> float:
    """CPU seconds (user + system, with reaped children's) of this process and every live descendant,
    from /proc (Linux): the pool's workers and a local Ray's daemons and workers are descendants."""
    tick = os.sysconf("SC_CLK_TCK")
    parent: dict[int, int] = {}
    used: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as handle:
                text = handle.read()
        except OSError:  # exited while listed
            continue
        fields = text[text.rindex(")") + 2:].split()  # proc(5): from field 3 (state) on
        parent[int(entry)] = int(fields[1])
        used[int(entry)] = sum(int(v) for v in fields[11:15]) / tick  # utime, stime, cutime, cstime
    tree, frontier = set(), [root or os.getpid()]
    while frontier:
        pid = frontier.pop()
        tree.add(pid)
        frontier += [child for child, up in parent.items() if up == pid and child not in tree]
    return sum(used.get(pid, 0.0) for pid in tree)


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

    def sweep(executor: Executor) -> tuple[pd.DataFrame, float, float]:
        t0, c0 = time.perf_counter(), tree_cpu_seconds()
        frame = what_if(cluster, workload, changes, sim_steps=args.sim_steps, executor=executor)
        return frame, time.perf_counter() - t0, tree_cpu_seconds() - c0

    os.environ.setdefault(LOOPBACK_ENV, "0")
    import ray

    t0 = time.perf_counter()
    ray.init(address="local", num_cpus=workers, include_dashboard=False, log_to_driver=False,
             object_store_memory=256 * 1024**2)
    ray_start_s = time.perf_counter() - t0
    executors = {"serial": Executor("serial"), "processes": Executor("processes", workers=workers),
                 "ray (local)": Executor("ray")}
    seconds: dict[str, list[float]] = {name: [] for name in executors}
    cpu: dict[str, list[float]] = {name: [] for name in executors}
    reference, same = None, True
    for _ in range(max(1, args.repeat)):  # the executors alternate, so a change of load hits all three
        for name, executor in executors.items():
            frame, wall, used = sweep(executor)
            seconds[name].append(wall)
            cpu[name].append(used)
            reference = frame if reference is None else reference
            same = same and frame.equals(reference)
            print(f"  {name}: {wall:.1f} s wall, {used:.1f} CPU s, same table as serial: "
                  f"{'yes' if frame.equals(reference) else 'NO'}")
    ray.shutdown()
    serial_s = min(seconds["serial"])
    print(f"{'executor':<14}{'best s':>8}{'median s':>10}{'speed-up':>10}{'CPU s':>8}{'cores got':>11}")
    for name, walls in seconds.items():
        best = walls.index(min(walls))
        print(f"{name:<14}{walls[best]:8.1f}{statistics.median(walls):10.1f}{serial_s / walls[best]:9.2f}x"
              f"{cpu[name][best]:8.1f}{cpu[name][best] / walls[best]:11.2f}")
    print("speed-up: best serial wall / best wall; CPU s: every process of the sweep (this one, its workers, "
          "Ray's daemons); cores got: CPU s / wall")
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
