"""The shape of a plan's Ray reservation: which placement groups, how many bundles, what each asks.

Pure data (no ray import), so `rlfleet export --to ray` and `rlfleet run` (runtime/placement.py)
build the same groups from one function. Every bundle asks for one device and a sliver of the
custom resource `accelerator_type:<TYPE>` (Ray sets it on GPU nodes; fake CPU nodes in tests
declare it), so a group can only land on nodes of its type. An engine of TP t takes t consecutive
bundles (its actor sits on the first; vLLM spawns the rest); the trainer takes one bundle per rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from traces.plan import Plan

TYPE_RESOURCE = "accelerator_type:{}"
TYPE_SHARE = 0.001  # any positive amount pins the bundle to a node that has the type at all
STRATEGY = "PACK"  # fill a node before the next: an engine's TP bundles share a node where they fit


def bundle(gpu_type: str, gpus: bool) -> dict[str, float]:
    """One device ({"GPU": 1} on GPU clusters, {"CPU": 1} on CPU-only machines) pinned to its type."""
    return {"GPU" if gpus else "CPU": 1.0, TYPE_RESOURCE.format(gpu_type): TYPE_SHARE}


@dataclass(frozen=True)
class GroupShape:
    """One plan group's reservation: `actors` actors, each on `per_actor` consecutive bundles."""

    role: Literal["rollout", "train"]
    gpu_type: str
    actors: int
    per_actor: int

    def bundles(self, gpus: bool) -> list[dict[str, float]]:
        return [bundle(self.gpu_type, gpus) for _ in range(self.actors * self.per_actor)]


def group_shapes(plan: Plan) -> tuple[GroupShape, ...]:
    """One group per rollout group (engines of TP bundles each), then the trainer (one per rank)."""
    shapes = [GroupShape("rollout", g.gpu_type, g.instances, g.tp) for g in plan.rollout]
    shapes.append(GroupShape("train", plan.trainer.gpu_type, plan.trainer.gpus, 1))
    return tuple(shapes)
