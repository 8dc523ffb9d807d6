"""`rlfleet plan` wall time as a user runs it (process start included), this tree beside an older commit.

Issue 19's acceptance figures: the default `rlfleet plan` (re-ranking, baselines, marginal values)
and the MILP alone (`--milp-only`) on fleets of 64 to 100,000 GPUs in 8-GPU nodes spread over 6 or
12 GPU types, each run as a subprocess of this tree and of the older commit (checked out with
`git worktree add` under /tmp/speed-base-REV) in the same run, one case after the other, the two
trees alternated run by run. An older commit without `--milp-only` runs what the issue timed as
the MILP alone there, `--no-baselines --top-k 1` (which still simulates, refines and re-plans for
the marginal values).
`--solvers` prints the older in-process table instead: the MILP under HiGHS and under CBC.
Usage: python bench/plan_speed.py [--full] [--runs N] [--base REV] [--only TEXT] [--solvers]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from base_tree import base_tree  # bench/base_tree.py: bench/ is the script folder, first on sys.path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner.api import plan_report  # noqa: E402 - the tree's own planner, whatever the working directory
from planner.candidates import candidates  # noqa: E402
from planner.milp import solve_async_fixed  # noqa: E402
from traces import Cluster, CostModel, Workload, get_model  # noqa: E402
from traces.lengths import LengthDist  # noqa: E402

TYPES = ["H800", "H20", "L40S", "A100-80G", "H100", "H200", "A10G", "L4", "A800", "L20", "B200", "MI300X"]
DEMO = ("traces/data/clusters/mixed-h800-h20-l40s.yaml", "traces/data/workloads/qwen2.5-7b-grpo-longtail.yaml")
# (label, GPUs, types, model, MILP alone); None GPUs: the README demo's shipped files
CASES: list[tuple[str, int | None, int, str, bool]] = [
    ("demo (README)", None, 3, "qwen2.5-7b", False),
    ("64 x 6, 7b", 64, 6, "qwen2.5-7b", False),
    ("1024 x 6, 7b", 1024, 6, "qwen2.5-7b", False),
    ("8192 x 12, 32b, MILP alone", 8192, 12, "qwen2.5-32b", True),
]
FULL: list[tuple[str, int | None, int, str, bool]] = [
    ("96 x 12, 32b", 96, 12, "qwen2.5-32b", False),
    ("8192 x 6, 7b", 8192, 6, "qwen2.5-7b", False),
    ("8192 x 12, 32b", 8192, 12, "qwen2.5-32b", False),
    ("100000 x 12, 32b, MILP alone", 100_000, 12, "qwen2.5-32b", True),
    ("100000 x 12, 32b", 100_000, 12, "qwen2.5-32b", False),
]
TIMEOUT = 1800  # seconds per run: the older commit's 100,000-GPU default took about 10 minutes


def fleet(gpus: int, types: int) -> Cluster:
    """`gpus` GPUs in 8-GPU nodes, spread as evenly as whole nodes allow over the first `types` types."""
    nodes = gpus // 8
    counts = [nodes // types + (1 if i < nodes % types else 0) for i in range(types)]
    groups = tuple({"gpu_type": t, "nodes": n} for t, n in zip(TYPES[:types], counts, strict=True))
    return Cluster(name=f"bench-{gpus}x{types}", node_groups=groups)


def workload(model: str) -> Workload:
    return Workload(name=f"bench-{model}", model=get_model(model), prompts_per_step=64, group_size=16,
                    prompt_len=LengthDist(kind="lognormal", mean=400, sigma=0.5, cap=1024),
                    response_len=LengthDist(kind="lognormal", mean=2000, sigma=0.9, cap=8192),
                    staleness=4, interruptible=True, ppo_minibatches=4)


def case_files(tmp: Path, gpus: int | None, types: int, model: str) -> tuple[str, str]:
    if gpus is None:
        return str(ROOT / DEMO[0]), str(ROOT / DEMO[1])
    c, w = tmp / f"c-{gpus}-{types}.yaml", tmp / f"w-{model}.yaml"
    c.write_text(yaml.safe_dump(fleet(gpus, types).model_dump(mode="json", exclude_none=True)), encoding="utf-8")
    wl = workload(model).model_dump(mode="json", exclude_none=True)
    wl["model"] = model  # by name, as a user's file names it
    w.write_text(yaml.safe_dump(wl), encoding="utf-8")
    return str(c), str(w)


def run_plan(tree: Path, files: tuple[str, str], extra: list[str]) -> tuple[float, dict[str, Any] | None]:
    """Wall seconds of one `python -m planner.cli plan ... --json` in `tree`, and its answer (None if it failed)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    argv = [sys.executable, "-m", "planner.cli", "plan", "--cluster", files[0], "--workload", files[1], "--json",
            *extra]
    t0 = time.perf_counter()
    try:
        out = subprocess.run(argv, env=env, cwd=tree, capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        return float("inf"), None
    seconds = time.perf_counter() - t0
    return seconds, (json.loads(out.stdout) if out.returncode == 0 else None)


def compare(args: argparse.Namespace) -> None:
    old_tree = base_tree(args.base)
    milp_only_then = "--milp-only" in (old_tree / "planner" / "commands" / "plan.py").read_text(encoding="utf-8")
    print(f"rlfleet plan wall seconds (process start included, median of {args.runs}); old = {args.base}, "
          f"new = this tree; {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} at start")
    print(f"{'case':<30} {'old s':>8} {'new s':>7} {'speed-up':>8} {'old samples/s':>13} {'new samples/s':>13} "
          f"{'same plan':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        for label, gpus, types, model, alone in CASES + (FULL if args.full else []):
            if args.only and args.only not in label:
                continue
            files = case_files(Path(tmp), gpus, types, model)
            old_flags = (["--milp-only"] if milp_only_then else ["--no-baselines", "--top-k", "1"]) if alone else []
            new_flags = ["--milp-only"] if alone else []
            old, new = [], []
            for _ in range(args.runs):  # alternated, so a busier minute slows both trees alike
                old.append(run_plan(old_tree, files, old_flags))
                new.append(run_plan(ROOT, files, new_flags))
            t_old, t_new = statistics.median(s for s, _ in old), statistics.median(s for s, _ in new)
            a, b = old[-1][1], new[-1][1]
            same = "n/a" if alone or a is None or b is None else ("yes" if a["plan"]["rollout"] == b["plan"]["rollout"]
                                                                 and a["plan"]["trainer"] == b["plan"]["trainer"]
                                                                 else "NO")
            rate = [f"{r['samples_per_s']:>13.2f}" if r else f"{'failed':>13}" for r in (a, b)]
            print(f"{label:<30} {t_old:>8.2f} {t_new:>7.2f} {t_old / t_new:>7.1f}x {rate[0]} {rate[1]} {same:>9}",
                  flush=True)


def timed(fn, *args, **kw):  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    out = fn(*args, **kw)
    return out, time.perf_counter() - t0


def solvers() -> None:
    """The in-process table: candidates + MILP + placement, and the MILP alone under HiGHS and CBC."""
    cm = CostModel()
    print(f"{'GPUs':>5} {'types':>5} {'model':<13} {'plan s':>7} {'gap':>8} {'HiGHS s':>8} {'CBC s':>7} "
          f"{'CBC/HiGHS':>9} {'samples/s':>9}")
    for gpus, types in ((64, 4), (1024, 6)):
        cluster = fleet(gpus, types)
        for model in ("qwen2.5-1.5b", "qwen2.5-7b", "qwen2.5-32b"):
            w = workload(model)
            fast, t_plan = timed(plan_report, cluster, w, top_k=1, cost_model=cm, sim_steps=0, baselines=False,
                                 marginal=False)
            cand = candidates(cm, cluster, w)
            _, t_highs = timed(solve_async_fixed, cand, solver_name="highs")
            _, t_cbc = timed(solve_async_fixed, cand, solver_name="cbc")
            print(f"{cluster.total_gpus:>5} {types:>5} {model:<13} {t_plan:>7.2f} {fast.chosen.solution.gap:>8.2e} "
                  f"{t_highs:>8.3f} {t_cbc:>7.3f} {t_cbc / t_highs:>9.1f} {fast.chosen.solution.samples_per_s:>9.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="add the 8,192 and 100,000-GPU defaults (tens of minutes)")
    ap.add_argument("--runs", type=int, default=1, help="runs of each case and tree (median; default 1)")
    ap.add_argument("--base", default="6d4c25d", help="the older commit (default: before issue 19's work)")
    ap.add_argument("--only", help="only the cases whose label holds this text (e.g. 'MILP alone', '100000')")
    ap.add_argument("--solvers", action="store_true", help="the in-process HiGHS vs CBC table instead")
    args = ap.parse_args()
    if args.solvers:
        solvers()
    else:
        compare(args)


if __name__ == "__main__":
    main()
