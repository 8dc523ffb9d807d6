"""A batch of plan requests (`plan_many`): each planned as `planner.api.plan_report` plans it, on an
executor (planner.executors), answers in request order and the same wherever they ran."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

from planner.api import plan_report
from planner.executors import Executor, Job, run
from traces import Cluster, CostModel, Plan, SpecError, Workload

# plan_report's keywords a request may set; the cost model is the batch's (shipped once per worker)
OPTIONS = tuple(name for name, p in inspect.signature(plan_report).parameters.items()
                if p.kind is inspect.Parameter.KEYWORD_ONLY and name != "cost_model")


@dataclass(frozen=True)
class PlanRequest:
    cluster: Cluster
    workload: Workload
    options: dict[str, Any] = field(default_factory=dict)  # plan_report keywords (objective, budget, ...)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.options) - set(OPTIONS))
        if unknown:
            raise SpecError(f"plan request option {unknown[0]!r} is not one of plan_report's: {', '.join(OPTIONS)}")


@dataclass(frozen=True)
class PlanAnswer:
    """One request's answer: its plan and PlanReport.summary(), or the one-line reason it has none."""

    plan: Plan | None
    summary: dict[str, Any]
    error: str = ""


def plan_many(requests: list[PlanRequest], *, cost_model: CostModel | None = None,
              executor: Executor | str | None = None) -> list[PlanAnswer]:
    """Plan every request on `executor` (default: local processes when more than one core)."""
    items = [{"cluster": r.cluster.model_dump(mode="json"), "workload": r.workload.model_dump(mode="json"),
              "options": r.options} for r in requests]
    answers = run(Job(_cost_model, _plan_one, cost_model or CostModel()), items, executor, "plan requests")
    return [PlanAnswer(Plan.model_validate(a["plan"]) if a["plan"] is not None else None, a["summary"], a["error"])
            for a in answers]


def _cost_model(payload: CostModel) -> CostModel:
    return payload


def _plan_one(cm: CostModel, item: dict[str, Any]) -> dict[str, Any]:
    cluster, workload = Cluster.model_validate(item["cluster"]), Workload.model_validate(item["workload"])
    try:
        report = plan_report(cluster, workload, cost_model=cm, **item["options"])
    except SpecError as exc:
        return {"plan": None, "summary": {}, "error": str(exc)}
    return {"plan": report.plan.model_dump(mode="json"), "summary": report.summary(), "error": ""}
