"""Calibrate the cost model to a user's own run: fit the roofline's efficiencies to its logged phases.

Given the run's cluster, workload and plan and its measured per-step phases (from an `rlfleet run`
timeline, or verl's `timing_s/*` metrics), the simulator predicts the same phases
(sim.breakdown) and traces.costmodel.fit moves the efficiency factors until they match: the
trainer's matmul efficiency from the logprob and train phases, the weight push's fixed cost from
sync, the engines' memory and matmul efficiencies and per-iteration overhead from generation
(verl's timing_s/gen, where the trainer waits for it) and the step. The bounds are wider than the
catalog fit's: a user's hardware may be anything (a CPU core, a throttled GPU). The result is
written as cost-table rows at the run's shapes, which `--profile` then takes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import astuple, dataclass

import numpy as np
import pandas as pd

from sim.breakdown import mean_phases
from sim.simulate import simulate
from traces import Cluster, CostModel, Plan, Workload
from traces.costmodel import COLUMNS, DEFAULT_EFFICIENCY, Efficiency, ProfileTable
from traces.costmodel.fit import Case, fit
from traces.errors import SpecError
from traces.links import sync_path_bytes_per_s, trainer_network
from traces.lora import table_name
from traces.records import recommended_steps

# Fitted fields and how far they may move for arbitrary hardware.
WIDE = {"matmul": (1e-3, 1.0), "memory": (1e-3, 1.0), "decode_overhead_s": (1e-5, 1.0),
        "train_matmul": (1e-3, 1.0), "sync_fixed_s": (1e-4, 60.0), "sync_per_tensor_s": (1e-7, 1e-2)}
# Which phase informs which fields (a phase with no measurement leaves its fields alone).
# `wait` is generation where the trainer waits for it (verl's timing_s/gen: sync and colocated modes).
ENGINE = ("memory", "matmul", "decode_overhead_s")
INFORMS = {"wait": ENGINE, "logprob": ("train_matmul",), "train": ("train_matmul",),
           "sync": ("sync_fixed_s", "sync_per_tensor_s"), "step": ENGINE}


@dataclass(frozen=True)
class Calibration:
    efficiency: Efficiency
    measured: dict[str, float]
    predicted: dict[str, float]  # with the fitted efficiency
    before: dict[str, float]  # with the starting one
    fields: tuple[str, ...]

    def errors(self) -> dict[str, float]:
        return {p: self.predicted[p] / v - 1.0 for p, v in self.measured.items() if v > 0}


def calibrate(cluster: Cluster, workload: Workload, plan: Plan, measured: Mapping[str, float], *,
              steps: int | None = None, seed: int = 0, start: Efficiency = DEFAULT_EFFICIENCY) -> Calibration:
    """The efficiency that reproduces `measured` (phase -> mean seconds per step) in simulation."""
    eta = plan.staleness
    n = steps or max(recommended_steps(eta), 6)
    memo: dict[tuple[object, ...], dict[str, float]] = {}

    def phases(cm: CostModel) -> dict[str, float]:
        key = astuple(cm.efficiency)
        if key not in memo:
            memo[key] = mean_phases(simulate(cluster, workload, plan, cm, steps=n, seed=seed,
                                             record_queue=False).timeline, eta)
        return memo[key]

    used = {p: float(v) for p, v in measured.items() if p in INFORMS and v > 0}
    if "step" not in used:
        raise SpecError("calibrate needs the step time of the run (timing_s/step, or a run folder's timeline)")
    cases = [Case(p, p, "phase", v, lambda cm, p=p: max(phases(cm)[p], 1e-12)) for p, v in used.items()]
    fields = tuple(dict.fromkeys(f for p in used for f in INFORMS[p]))
    fitted = fit(cases, fields, start=start, tables=ProfileTable.empty(), bounds=WIDE, max_evals=200)
    return Calibration(fitted, dict(used), phases(CostModel.roofline_only(fitted)),
                       phases(CostModel.roofline_only(start)), fields)


def profile_rows(cal: Calibration, cluster: Cluster, workload: Workload, plan: Plan, source: str) -> pd.DataFrame:
    """Cost-table rows of the fitted model at the run's shapes: each engine group's decode and
    prefill, the trainer's train and logprob passes, the weight push to its engines."""
    cm = CostModel.roofline_only(cal.efficiency)
    model, rows = workload.model, []
    longest = workload.max_seq_len
    contexts = np.unique(np.geomspace(max(2, workload.prompt_len.expected() // 2), longest * 2, 12).astype(int))
    batches = np.unique(np.geomspace(1, max(2, cal.efficiency.max_num_seqs), 10).astype(int))
    for g in plan.rollout:
        gpu = cluster.resolve(g.gpu_type)
        for b in batches:
            for ctx in contexts:
                rows.append((gpu.name, "decode", g.tp, 1, 1, int(b), int(ctx), 0,
                             float(cm.decode(gpu, model, g.tp, int(b), int(ctx)).seconds), model.name))
        for tokens in np.unique(np.geomspace(1, 64 * longest, 16).astype(int)):
            ctx = min(int(tokens), int(workload.prompt_len.expected()) or 1)
            rows.append((gpu.name, "prefill", g.tp, 1, 1, 1, ctx, int(tokens),
                         float(cm.prefill(gpu, model, g.tp, int(tokens), ctx).seconds), model.name))
    t = plan.trainer
    gpu = cluster.resolve(t.gpu_type)
    batch_tokens = workload.samples_per_step * workload.mean_tokens_per_sample
    kw = {"seq_len": workload.mean_tokens_per_sample, "microbatch_tokens": workload.microbatch_tokens,
          "zero_stage": t.zero_stage, "kernels": workload.trainer_kernels,
          **trainer_network(cluster, plan)}  # as the simulator prices the trainer (traces.costmodel.rl)
    # a LoRA run's train, sync and policy logprob rows are filed apart from the base model's
    # (traces.lora.table_name); its reference pass is the base's
    rank = workload.lora_rank
    lora = table_name(model, rank)
    for tokens in np.unique(np.geomspace(max(1.0, batch_tokens / 64), batch_tokens * 4, 12).astype(int)):
        rows.append((gpu.name, "train", t.tp, t.pp, t.dp, 1, 0, int(tokens),
                     float(cm.train(gpu, model, t.dp, t.tp, t.pp, int(tokens), recompute=t.recompute,
                                    lora_rank=rank, **kw).seconds), lora))
        for r in dict.fromkeys((rank, 0)):
            rows.append((gpu.name, "logprob", t.tp, t.pp, t.dp, 1, 0, int(tokens),
                         float(cm.logprob(gpu, model, t.dp, t.tp, t.pp, int(tokens), lora_rank=r, **kw).seconds),
                         table_name(model, r)))
    engines = sum(g.instances for g in plan.rollout)
    path = sync_path_bytes_per_s(cluster, plan)
    for k in sorted({1, max(1, engines // 2), engines, engines * 2}):
        rows.append((gpu.name, "sync", 1, 1, 1, k, 0, 0, float(cm.sync(gpu, model, k, path, rank).seconds), lora))
    # each row is built as (gpu, stage, tp, pp, dp, batch, context, tokens, seconds, table name)
    return pd.DataFrame([(r[0], r[9], *r[1:9], source) for r in rows],
                        columns=list(COLUMNS))
