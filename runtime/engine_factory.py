"""How a rollout group's engine actors are built, and what of a plan group an engine kind refuses.

The fleet (runtime.fleet) spawns every engine through an `EngineFactory`: `SpecEngines` ships one
`EngineSpec` (runtime.engine_spec: vLLM or the torch engine, the same for every engine of a run) to
each `EngineWorker` actor with its group's running cap and TP. `group_refusal` is the rule run
before anything starts (runtime.run_plan): what a plan's rollout group asks that the chosen kind
cannot run here, said in one line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from transformers import PretrainedConfig

from runtime.engine_spec import EngineSpec, vllm_blocker
from runtime.engine_worker import EngineWorker
from traces import RolloutGroup


class EngineFactory(Protocol):
    @property
    def kind(self) -> str: ...

    def spawn(self, options: dict[str, Any], name: str, seed: int, max_batch: int, tp: int = 1) -> Any:
        """A new engine actor placed by `options` (Ray `.options(**...)`), running at most `max_batch`
        sequences with `tp`-way tensor parallelism."""
        ...


@dataclass(frozen=True)
class SpecEngines:
    """Engines built from one `EngineSpec`, each in an `EngineWorker` actor (vLLM's with its environment)."""

    spec: EngineSpec

    @property
    def kind(self) -> str:
        return self.spec.kind

    def spawn(self, options: dict[str, Any], name: str, seed: int, max_batch: int, tp: int = 1) -> Any:
        import ray

        return ray.remote(EngineWorker).options(**options, **self.spec.actor_options()).remote(
            replace(self.spec, max_batch=max_batch), name, seed, tp=tp)


def group_refusal(kind: str, config: PretrainedConfig, in_process: bool = False
                  ) -> Callable[[RolloutGroup, int], str | None]:
    """Why engines of `kind` cannot run plan rollout group `index` as planned here, or None."""

    def refusal(group: RolloutGroup, index: int) -> str | None:
        if kind == "torch" and group.tp > 1:
            return (f"rollout group {index} asks tp {group.tp}, but the torch engine runs on one device (tp 1); "
                    "plan it with tp 1 (or --engine vllm, on GPUs)")
        if kind == "vllm" and (why := vllm_blocker(config, group.tp, in_process)) is not None:
            return f"--engine vllm: {why}"
        return None

    return refusal
