"""Fires the `Faults` a test or drill asks for: real `ray.kill`s (no restart) at set points of the driver's loop."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from runtime.fleet import EngineHandle
from runtime.ray_futures import dead, gather
from runtime.settings import Faults


class FaultInjector:
    """Each fault fires once; the driver calls the hook of each set point and the injector decides."""

    def __init__(self, faults: Faults) -> None:
        self.faults = faults
        self._fired: set[str] = set()

    def trainer_step_started(self, step: int, ranks: Sequence[Any]) -> None:
        """A step is in flight on the trainer ranks: `kill_trainer` kills its rank during that step."""
        self._fire("kill_trainer", self.faults.kill_trainer == step, ranks[self.faults.kill_trainer_rank])

    def before_sync(self, version: int, engines: Sequence[EngineHandle]) -> None:
        """`version` is about to be broadcast: `kill_engine_in_sync` kills its engine first, and waits for
        it to die: ray.kill only asks, and a broadcast sent before the kill lands would complete, so the
        fault would miss the sync it is meant to break (seen as a flaky test)."""
        engine = _engine_at(self.faults.kill_engine_in_sync, version, engines)
        if engine is not None and self._fire("kill_engine_in_sync", True, engine.actor):
            _await_death(engine.actor)

    def synced(self, version: int, engines: Sequence[EngineHandle]) -> None:
        """`version` is on the engines: `kill_engine` kills its engine now."""
        engine = _engine_at(self.faults.kill_engine, version, engines)
        if engine is not None:
            self._fire("kill_engine", True, engine.actor)

    def _fire(self, name: str, due: bool, actor: Any) -> bool:
        import ray

        if not due or name in self._fired:
            return False
        self._fired.add(name)
        ray.kill(actor, no_restart=True)
        return True


def _engine_at(fault: tuple[int, int] | None, version: int, engines: Sequence[EngineHandle]) -> EngineHandle | None:
    if fault is None or fault[1] != version:
        return None
    return next((e for e in engines if e.index == fault[0]), None)


def _await_death(actor: Any, timeout_s: float = 30.0) -> None:
    """Return once a killed engine actor answers calls with RayActorError (or after `timeout_s`)."""
    deadline = time.time() + timeout_s
    while time.time() < deadline and not dead(gather([actor.status.remote()])[0]):
        time.sleep(0.05)

