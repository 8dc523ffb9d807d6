"""How a rollout group's engine actors are built: one small factory per engine kind.

The fleet (runtime.fleet) spawns every engine through a factory, so another kind (vLLM, with its
TP) plugs in by providing `refusal` (what of a plan group it cannot run, said before anything
starts) and `spawn` (one engine actor with the given Ray options, name, seed and running cap).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from transformers import PreTrainedModel

from runtime.engine_worker import EngineWorker
from traces import RolloutGroup


class EngineFactory(Protocol):
    kind: ClassVar[str]

    @staticmethod
    def refusal(group: RolloutGroup, index: int) -> str | None:
        """Why this kind cannot run plan rollout group `index` as planned, or None (asked before anything starts)."""
        ...

    def spawn(self, options: dict[str, Any], name: str, seed: int, max_batch: int) -> Any:
        """A new engine actor placed by `options` (Ray `.options(**...)`)."""
        ...


@dataclass(frozen=True)
class TorchEngines:
    """`TorchEngine`s (runtime.engine) in `EngineWorker` actors: one device each, so TP 1 only."""

    kind: ClassVar[str] = "torch"
    model: PreTrainedModel | str  # the initial model, or its Hugging Face folder
    eos_id: int
    pad_id: int
    interruptible: bool = True

    @staticmethod
    def refusal(group: RolloutGroup, index: int) -> str | None:
        if group.tp > 1:
            return (f"rollout group {index} asks tp {group.tp}, but the torch engine runs on one device (tp 1); "
                    "plan it with tp 1")
        return None

    def spawn(self, options: dict[str, Any], name: str, seed: int, max_batch: int) -> Any:
        import ray

        return ray.remote(EngineWorker).options(**options).remote(
            self.model, self.eos_id, self.pad_id, name, max_batch, seed, self.interruptible)
