"""The rollout engine's Ray actor: a `TorchEngine` in its own process, one rank of the weight-sync group."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from runtime.engine import Completion, Interval, Request, TorchEngine
from runtime.model import model_of
from runtime.settings import SYNC_TIMEOUT_S
from runtime.sync import DEFAULT_BUCKET_BYTES, SyncGroup, WeightReceiver


@dataclass(frozen=True)
class EngineStatus:
    """An engine's routing view after a call: `accepts` is the version new requests would start at."""

    accepts: int | None  # None: draining before a weight load, takes nothing new
    load: int
    capacity: int
    idle: bool  # no request and no weight load waiting: a step would do nothing


class EngineWorker:
    """A `TorchEngine` in its own process, one sync-group rank. Plain class; `ray.remote` wraps it."""

    def __init__(self, model: PreTrainedModel | str, eos_id: int, pad_id: int, name: str, max_batch: int,
                 seed: int, interruptible: bool, threads: int = 1) -> None:
        torch.set_num_threads(threads)  # a busy small machine: OpenMP spinning costs more than it gains
        self.engine = TorchEngine(model_of(model), eos_id, pad_id, name=name, max_batch=max_batch, seed=seed,
                                  interruptible=interruptible, clock=time.time)
        self._received = self.engine.version  # the last version loaded or queued
        self._receiver: WeightReceiver | None = None

    def join_sync(self, host: str, port: int, rank: int, world_size: int,
                  bucket_bytes: int = DEFAULT_BUCKET_BYTES, timeout_s: float = SYNC_TIMEOUT_S) -> None:
        """Join a (new) sync group; a previous group, broken by a dead rank, is dropped."""
        self._receiver = None
        group = SyncGroup(host, port, rank, world_size, timeout_s=timeout_s)
        self._receiver = WeightReceiver(group, self.engine.model.state_dict(), bucket_bytes)

    def receive_weights(self) -> EngineStatus:
        """Take part in one weight broadcast; the weights apply at the engine's next iteration boundary.

        A version already held is not loaded again: after a fault the group re-broadcasts the current
        version for a new engine, and reloading would make the others re-prefill for nothing."""
        assert self._receiver is not None, "join_sync first"
        state, version = self._receiver.receive()
        if version != self._received:
            self.engine.load_weights(state, version)  # copies them: the receiver overwrites its tensors next time
            self._received = version
        return self.status()

    def step(self, requests: Sequence[Request]) -> tuple[list[Completion], list[Interval], EngineStatus]:
        self.engine.submit(requests)
        completions = self.engine.step()
        return completions, self.engine.drain_intervals(), self.status()

    def status(self) -> EngineStatus:
        e = self.engine
        accepts = next((v for v in (self._received, e.version) if e.accepting(v)), None)
        # queued weights apply only inside step(): an engine holding some is not idle, or a draining
        # engine with no rows left would never load them and never accept again
        return EngineStatus(accepts, e.load(), e.capacity(), e.idle() and e.version == self._received)

    def weights(self) -> dict[str, torch.Tensor]:
        return {k: v.clone() for k, v in self.engine.model.state_dict().items()}

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()
