"""How fast the simulator runs a 1024-GPU async plan, and what the closed-form fast path buys.

Prints wall time, events/s and simulated seconds per wall second for 50 steps of qwen2.5-7b GRPO
(512 prompts x 16 samples, lengths long-tailed up to 16k) on 256 H800 trainer GPUs + 768 H20
engines; then runs the same plan in the token-level reference mode and the fast path side by
side for a short horizon and prints the speed-up (the token-level mode at 50 steps would take
hours). The machine this runs on is shared: --repeat N runs the fast path N times (after a 1-step
warm-up that loads the compiled kernels) and prints the best and the median, wall and CPU
(bench/sim_compare.py --speed alternates two trees).
Usage: python bench/sim_speed.py [--steps 50] [--ref-steps 1] [--repeat 3]
"""

from __future__ import annotations

import argparse
import time

from sim import simulate
from traces import Cluster, CostModel, Plan, RolloutGroup, TrainerGroup, get_model
from traces.lengths import LengthDist
from traces.workload import Workload

CLUSTER = Cluster(name="bench-1024", node_groups=(
    {"gpu_type": "H800", "nodes": 32, "gpus_per_node": 8},
    {"gpu_type": "H20", "nodes": 96, "gpus_per_node": 8},
))
WORKLOAD = Workload(
    name="bench", model=get_model("qwen2.5-7b"), prompts_per_step=512, group_size=16,
    prompt_len=LengthDist(kind="lognormal", mean=400, sigma=0.5, cap=1024),
    response_len=LengthDist(kind="lognormal", mean=2000, sigma=1.0, cap=16384),
    mode="async", staleness=4, interruptible=True, reward_seconds=0.05, ppo_minibatches=4,
)
PLAN = Plan(mode="async", staleness=4, rollout=(RolloutGroup(gpu_type="H20", tp=1, instances=768),),
            trainer=TrainerGroup(gpu_type="H800", dp=256))


def timed(steps: int, token_level: bool) -> tuple[float, float, int, float]:
    """Wall seconds, simulated seconds, events, and CPU seconds (steadier on a shared machine)."""
    t0, c0 = time.perf_counter(), time.process_time()
    r = simulate(CLUSTER, WORKLOAD, PLAN, CostModel.roofline_only(), steps=steps, seed=0,
                 token_level=token_level, record_queue=False)
    return time.perf_counter() - t0, r.sim_seconds, r.events, time.process_time() - c0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--ref-steps", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3, help="fast-path runs (best and median reported)")
    args = ap.parse_args()
    print(f"plan: {PLAN.total_gpus} GPUs ({PLAN.rollout[0].instances} H20 engines, H800 trainer dp"
          f"{PLAN.trainer.dp}), {WORKLOAD.samples_per_step} samples/step, responses up to 16k")
    # a process's first simulation loads the compiled kernels (sim.kernels; compiles them after an
    # install): a one-off cost, timed apart from the runs measured
    warm = timed(1, token_level=False)[0]
    print(f"first simulation in this process (loads the compiled kernels), 1 step: {warm:.2f} s")
    runs = [timed(args.steps, token_level=False) for _ in range(max(1, args.repeat))]
    _, sim_s, events, _ = runs[0]  # the same in every run (seeded)
    walls, cpus = sorted(r[0] for r in runs), sorted(r[3] for r in runs)
    for label, i in (("best", 0), ("median", len(runs) // 2)):
        wall, cpu = walls[i], cpus[i]
        print(f"fast path, {args.steps} steps, {label} of {len(runs)}: wall {wall:.2f} s (cpu {cpu:.2f} s), {events} "
              f"events ({events / wall:,.0f}/s), {sim_s:,.0f} simulated s = {sim_s / wall:,.0f} simulated s per wall s "
              f"({sim_s / cpu:,.0f} per cpu s)")
    fast_wall, fast_sim, fast_events, _ = timed(args.ref_steps, token_level=False)
    ref_wall, ref_sim, ref_events, _ = timed(args.ref_steps, token_level=True)
    assert abs(fast_sim - ref_sim) <= 1e-6 * ref_sim, (fast_sim, ref_sim)
    print(f"same plan, {args.ref_steps} step(s), side by side: token-level {ref_wall:.2f} s wall "
          f"({ref_events} events) vs fast {fast_wall:.3f} s ({fast_events} events): "
          f"speed-up {ref_wall / fast_wall:,.0f}x, events {ref_events / fast_events:,.0f}x fewer")


if __name__ == "__main__":
    main()
