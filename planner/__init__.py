"""planner: which GPUs generate and which train. `planner.plan(cluster, workload, ...) -> Plan`.

The API is loaded on first use, so `rlfleet` commands that do not plan start fast.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Change", "Executor", "PlanRequest", "pareto", "plan", "plan_many", "plan_report", "what_if"]


def __getattr__(name: str) -> Any:
    if name in ("plan", "plan_report"):
        from planner import api

        return getattr(api, name)
    if name in ("PlanRequest", "plan_many"):
        from planner import batch

        return getattr(batch, name)
    if name == "Executor":
        from planner import executors

        return executors.Executor
    if name in __all__:
        from planner import sweeps

        return getattr(sweeps, name)
    raise AttributeError(f"module 'planner' has no attribute {name!r}")
