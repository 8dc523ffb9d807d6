"""Results of Ray calls where an actor may have died: a failed call stands in its own place."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def gather(futures: Sequence[Any]) -> list[Any]:
    """Each future's result, or its Ray error (a dead actor, a task that raised) in its place: one
    failed call must not hide the others' results."""
    import ray
    from ray.exceptions import RayActorError, RayTaskError

    out: list[Any] = []
    for future in futures:
        try:
            out.append(ray.get(future))
        except (RayActorError, RayTaskError) as exc:
            out.append(exc)
    return out


def dead(result: Any) -> bool:
    """The result says its actor died (rather than that the call raised)."""
    from ray.exceptions import RayActorError

    return isinstance(result, RayActorError)
