"""Predicted vs measured: simulate a recorded run's own plan, workload and cluster, and compare.

The measured figure is the run's steady-state throughput (traces.records.steady_state); the
prediction simulates as many steps with the given cost model (a `rlfleet profile` table of the
machine that ran it, where one exists) over the same window. Which source priced each stage is
reported beside the error: a prediction from the roofline alone says so.

Per plan group and phase (a run with a placement record, i.e. on Ray): busy seconds per trainer
step, summed over the group's engines (or the trainer's rank 0), in the run's timeline and in the
simulation's, both through traces.records.group_phases over the whole run. Only busy time compares:
the simulator files a run of decode iterations as one interval where the runtime files each.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sim.result import SimResult
from sim.simulate import engine_name, simulate
from traces import CostModel, Plan
from traces.records import TRAINER_KEY, RunRecord, group_phases, rollout_key


@dataclass(frozen=True)
class Fidelity:
    measured_samples_per_s: float
    predicted_samples_per_s: float
    steps: int
    sources: dict[str, str]  # stage -> where its cost came from (profile, profile-scaled, roofline)
    simulation: SimResult
    # group -> phase -> (predicted, measured) busy seconds per step; empty without a placement record
    groups: dict[str, dict[str, tuple[float, float]]] = field(default_factory=dict)

    @property
    def error(self) -> float:
        """(predicted - measured) / measured: +0.10 predicts 10% more throughput than was measured."""
        return self.predicted_samples_per_s / self.measured_samples_per_s - 1.0

    def summary(self) -> dict[str, object]:
        return {"measured_samples_per_s": round(self.measured_samples_per_s, 3),
                "predicted_samples_per_s": round(self.predicted_samples_per_s, 3),
                "error": round(self.error, 4), "steps": self.steps, "cost_sources": self.sources,
                "groups": {g: {ph: {"predicted_s_per_step": round(p, 6), "measured_s_per_step": round(m, 6)}
                               for ph, (p, m) in phases.items()} for g, phases in self.groups.items()}}


def predict_run(record: RunRecord, cost_model: CostModel | None = None, seed: int = 0) -> Fidelity:
    cm = cost_model or CostModel()
    result = simulate(record.cluster, record.workload, record.plan, cm, steps=record.steps, seed=seed)
    return Fidelity(record.samples_per_s(), result.samples_per_s, record.steps, stage_sources(cm, record),
                    result, group_comparison(record, result))


def simulated_groups(plan: Plan) -> dict[str, str]:
    """The simulation's timeline resource -> plan group (traces.records' keys)."""
    out = {engine_name(g, gi, i): rollout_key(gi) for gi, g in enumerate(plan.rollout) for i in range(g.instances)}
    out["trainer"] = TRAINER_KEY  # sim.trainer.Trainer's name
    return out


def group_comparison(record: RunRecord, result: SimResult) -> dict[str, dict[str, tuple[float, float]]]:
    """group -> phase -> (predicted, measured) busy seconds per step, phases either side has."""
    measured_by = record.group_of()
    if not measured_by:
        return {}
    steps = max(record.steps, 1)
    predicted = group_phases(result.timeline, simulated_groups(record.plan))
    measured = group_phases(record.timeline, measured_by)
    out: dict[str, dict[str, tuple[float, float]]] = {}
    for group in [*(rollout_key(i) for i in range(len(record.plan.rollout))), TRAINER_KEY]:
        p, m = predicted.get(group, {}), measured.get(group, {})
        out[group] = {phase: (_busy(p, phase) / steps, _busy(m, phase) / steps) for phase in sorted(set(p) | set(m))}
    return out


def _busy(phases: dict[str, dict[str, float]], phase: str) -> float:
    return phases.get(phase, {}).get("seconds", 0.0)


def stage_sources(cm: CostModel, record: RunRecord) -> dict[str, str]:
    """Each stage priced at the run's typical shape: which source answered."""
    w, plan = record.workload, record.plan
    engine = record.cluster.gpu(plan.rollout[0].gpu_type)
    trainer = record.cluster.gpu(plan.trainer.gpu_type)
    t = plan.trainer
    prompt = w.prompt_len.expected()
    tokens = w.samples_per_step * w.mean_tokens_per_sample
    estimates = {
        "prefill": cm.prefill(engine, w.model, plan.rollout[0].tp, prompt * w.group_size, prompt),
        "decode": cm.decode(engine, w.model, plan.rollout[0].tp, w.group_size, prompt + w.response_len.expected()),
        "logprob": cm.logprob(trainer, w.model, t.dp, t.tp, t.pp, tokens, lora_rank=w.lora_rank),
        "train": cm.train(trainer, w.model, t.dp, t.tp, t.pp, tokens / w.ppo_minibatches, lora_rank=w.lora_rank),
        "sync": cm.sync(trainer, w.model, sum(g.instances for g in plan.rollout), 1e9, w.lora_rank),
    }
    return {stage: "+".join(sorted(e.sources)) for stage, e in estimates.items()}
