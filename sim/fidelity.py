"""Predicted vs measured: simulate a recorded run's own plan, workload and cluster, and compare.

The measured figure is the run's steady-state throughput (traces.records.steady_state); the
prediction simulates as many steps with the given cost model (a `rlfleet profile` table of the
machine that ran it, where one exists) over the same window. Which source priced each stage is
reported beside the error: a prediction from the roofline alone says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.result import SimResult
from sim.simulate import simulate
from traces import CostModel
from traces.records import RunRecord


@dataclass(frozen=True)
class Fidelity:
    measured_samples_per_s: float
    predicted_samples_per_s: float
    steps: int
    sources: dict[str, str]  # stage -> where its cost came from (profile, profile-scaled, roofline)
    simulation: SimResult

    @property
    def error(self) -> float:
        """(predicted - measured) / measured: +0.10 predicts 10% more throughput than was measured."""
        return self.predicted_samples_per_s / self.measured_samples_per_s - 1.0

    def summary(self) -> dict[str, object]:
        return {"measured_samples_per_s": round(self.measured_samples_per_s, 3),
                "predicted_samples_per_s": round(self.predicted_samples_per_s, 3),
                "error": round(self.error, 4), "steps": self.steps, "cost_sources": self.sources}


def predict_run(record: RunRecord, cost_model: CostModel | None = None, seed: int = 0) -> Fidelity:
    cm = cost_model or CostModel()
    result = simulate(record.cluster, record.workload, record.plan, cm, steps=record.steps, seed=seed)
    return Fidelity(record.samples_per_s(), result.samples_per_s, record.steps, stage_sources(cm, record),
                    result)


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
        "logprob": cm.logprob(trainer, w.model, t.dp, t.tp, t.pp, tokens),
        "train": cm.train(trainer, w.model, t.dp, t.tp, t.pp, tokens / w.ppo_minibatches),
        "sync": cm.sync(trainer, w.model, sum(g.instances for g in plan.rollout), 1e9),
    }
    return {stage: "+".join(sorted(e.sources)) for stage, e in estimates.items()}
