"""The rollout engine's Ray actor: a vLLM or torch engine (runtime.engine_spec) in its own process, one
member of the weight-sync group (a vLLM engine's workers are its ranks)."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from runtime.engine import Completion, Interval, Request, TorchEngine
from runtime.engine_spec import EngineSpec
from runtime.settings import SYNC_TIMEOUT_S
from runtime.sync import DEFAULT_BUCKET_BYTES


@dataclass(frozen=True)
class EngineStatus:
    """An engine's routing view after a call: `accepts` is the version new requests would start at."""

    accepts: int | None  # None: draining before a weight load, takes nothing new
    load: int
    capacity: int
    idle: bool  # no request and no weight load waiting: a step would do nothing


class EngineWorker:
    """A rollout engine (`EngineSpec`: vLLM or torch) in its own process, one sync-group member.
    Plain class; `ray.remote` wraps it (with `EngineSpec.actor_options`)."""

    def __init__(self, spec: EngineSpec, name: str, seed: int, tp: int = 1, threads: int = 1) -> None:
        torch.set_num_threads(threads)  # a busy small machine: OpenMP spinning costs more than it gains
        self.engine = spec.build(name, seed, tp=tp, clock=time.time)
        self.tp = tp

    def sync_ranks(self) -> int:
        """Ranks this engine takes in the sync group (a vLLM engine: one per worker)."""
        return self.engine.sync_ranks

    def join_sync(self, host: str, port: int, rank: int, world_size: int,
                  bucket_bytes: int = DEFAULT_BUCKET_BYTES, timeout_s: float = SYNC_TIMEOUT_S) -> None:
        """Join a (new) sync group; a previous group, broken by a dead rank, is dropped."""
        self.engine.join_sync(host, port, rank, world_size, bucket_bytes, timeout_s)

    def receive_weights(self) -> EngineStatus:
        """Take part in one weight broadcast; the weights apply at the engine's next iteration boundary
        (a version already held is not loaded again: runtime.engine's `receive_weights`)."""
        self.engine.receive_weights()
        return self.status()

    def step(self, requests: Sequence[Request]) -> tuple[list[Completion], list[Interval], EngineStatus]:
        self.engine.submit(requests)
        completions = self.engine.step()
        return completions, self.engine.drain_intervals(), self.status()

    def status(self) -> EngineStatus:
        e = self.engine
        target = e.target_version
        # queued weights apply only inside step(): an engine holding some is not idle, or a draining
        # engine with no rows left would never load them and never accept again
        return EngineStatus(target if e.accepting(target) else None, e.load(), e.capacity(),
                            e.idle() and e.version == target)

    def weights(self) -> dict[str, torch.Tensor]:
        """The torch engine's weights (tests compare them with the trainer's; vLLM's live in its workers)."""
        if not isinstance(self.engine, TorchEngine):
            raise TypeError(f"weights() reads a torch engine's model; this engine is {type(self.engine).__name__}")
        return {k: v.clone() for k, v in self.engine.model.state_dict().items()}

    def describe(self) -> dict[str, Any]:
        """What this engine is and where it runs (the run's record of its engines)."""
        import ray

        context = ray.get_runtime_context()
        return {"name": self.engine.name, "engine": type(self.engine).__name__, "tp": self.tp,
                "sync_ranks": self.engine.sync_ranks, "pid": os.getpid(), "node": context.get_node_id(),
                "version": self.engine.version, "completed": self.engine.stats().completed}

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()
