"""The trainer's Ray actors: one `TrainerWorker` per trainer rank, and their start on the trainer's placement group."""

from __future__ import annotations

import hashlib
import os
import time
from typing import Any

import torch
from transformers import PreTrainedModel

from runtime.model import model_of
from runtime.parallel import DataParallelTrainer, init_dp_group
from runtime.placement import Group
from runtime.settings import SYNC_TIMEOUT_S
from runtime.sync import DEFAULT_BUCKET_BYTES, SyncGroup, WeightSender
from runtime.trainer import Rollout, StepStats, TrainConfig, Trainer


class TrainerWorker:
    """One trainer rank in its own process. Rank 0 is the sync group's rank 0 (it hosts its store and
    sends the weights) and writes the checkpoints; with dp > 1 every rank is a `DataParallelTrainer`
    replica, built only once the dp group is formed (`open_dp`, then `join_dp` on every rank at once)."""

    def __init__(self, model: PreTrainedModel | str, pad_id: int, config: TrainConfig, seed: int,
                 threads: int = 1, rank: int = 0, dp: int = 1) -> None:
        torch.set_num_threads(threads)
        torch.manual_seed(seed)
        self.rank, self.dp = rank, dp
        self._args = (model_of(model), pad_id, config, seed)
        # dp = 1: the plain Trainer, no process group, exactly as before dp existed
        self._trainer: Trainer | None = None if dp > 1 else Trainer(*self._args, clock=time.time)
        self._dp_store: Any = None
        self._store: Any = None
        self._world = 0
        self._sender: WeightSender | None = None
        self.steps_trained = 0  # train_step calls that returned here: shows every rank took part

    @property
    def trainer(self) -> Trainer:
        assert self._trainer is not None, "a dp rank trains only after join_dp"
        return self._trainer

    def open_dp(self, timeout_s: float = SYNC_TIMEOUT_S) -> tuple[str, int]:
        """Rank 0: host the dp group's store on this node (the other ranks connect to (host, port))."""
        import ray

        host = ray.util.get_node_ip_address()
        self._dp_store = SyncGroup.host_store(host, self.dp, timeout_s)
        return host, int(self._dp_store.port)

    def join_dp(self, host: str, port: int, timeout_s: float = SYNC_TIMEOUT_S) -> None:
        """Join the dp group (blocks until every rank has) and build this rank's replica.

        DDP's construction broadcasts rank 0's weights, so all replicas start equal."""
        init_dp_group(self.rank, self.dp, host, port, store=self._dp_store, timeout_s=timeout_s)
        self._trainer = DataParallelTrainer(*self._args, clock=time.time)

    def describe(self) -> dict[str, Any]:
        """Where this rank runs and what it holds: the driver's proof that every rank trained in step."""

        digest = hashlib.sha256()
        for name, tensor in sorted(self.trainer.weights().items()):
            digest.update(name.encode())
            digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
        return {"rank": self.rank, "pid": os.getpid(), "node": self.node_id(),
                "version": self.trainer.version, "optimizer_steps": self.trainer.optimizer_steps(),
                "steps_trained": self.steps_trained, "weights_sha256": digest.hexdigest()}

    def open_sync(self, world_size: int, timeout_s: float = SYNC_TIMEOUT_S) -> tuple[str, int]:
        """Host a new sync group's store on a free port of this node; engines connect to (host, port).

        A new store per group: a rebuilt group (after a fault) must not meet the old one's keys."""
        import ray

        self._sender = None  # the old group, if any, is dropped
        host = ray.util.get_node_ip_address()
        self._store = SyncGroup.host_store(host, world_size, timeout_s)
        self._world = world_size
        return host, int(self._store.port)

    def join_sync(self, bucket_bytes: int = DEFAULT_BUCKET_BYTES, timeout_s: float = SYNC_TIMEOUT_S) -> None:
        group = SyncGroup("", 0, 0, self._world, timeout_s=timeout_s, store=self._store)
        self._sender = WeightSender(group, bucket_bytes)

    def train_step(self, batch: list[Rollout]) -> tuple[StepStats, tuple[tuple[str, float, float], ...]]:
        stats = self.trainer.train_step(batch)
        self.steps_trained += 1
        return stats, self.trainer.last_intervals

    def send_weights(self) -> tuple[int, float, float]:
        """Broadcast the current weights and version to every engine; (version, start, end)."""
        assert self._sender is not None, "join_sync first"
        t0 = time.time()
        self._sender.send(self.trainer.weights(), self.trainer.version)
        return self.trainer.version, t0, time.time()

    def weights(self) -> dict[str, torch.Tensor]:
        return {k: v.clone() for k, v in self.trainer.weights().items()}

    def save_checkpoint(self, path: str) -> None:
        self.trainer.save_checkpoint(path)

    def load_checkpoint(self, path: str) -> int:
        self.trainer.load_checkpoint(path)
        return self.trainer.version

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()


def start_trainers(group: Group, model: PreTrainedModel | str, pad_id: int, train: TrainConfig, seed: int,
                   timeout_s: float = SYNC_TIMEOUT_S) -> list[Any]:
    """One trainer actor per bundle of the trainer group, rank r on bundle r; with dp > 1 they form the
    dp group, whose store rank 0 hosts. Rank 0's actor first."""
    import ray

    dp = group.actors
    cls = ray.remote(TrainerWorker)
    ranks = [cls.options(**group.actor_options(r)).remote(model, pad_id, train, seed, rank=r, dp=dp)
             for r in range(dp)]
    if dp > 1:
        host, port = ray.get(ranks[0].open_dp.remote(timeout_s))
        # every rank must be inside init_process_group at once: issue all joins, then wait
        ray.get([rank.join_dp.remote(host, port, timeout_s) for rank in ranks])
    return ranks
