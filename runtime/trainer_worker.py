"""The trainer's Ray actors: one `TrainerWorker` per trainer rank, and their start on the trainer's placement group.

A trainer of dp x tp ranks is dp * tp actors, rank r on bundle r (tp innermost: runtime.tensor_parallel's
mesh). The driver talks to rank 0 alone for weights and checkpoints; with tp > 1 those gather shards, a
collective of every rank, so rank 0 calls the other ranks itself (`join`) while it takes part. The driver
calls nothing else on the trainer meanwhile (it waits for the broadcast and the save before the next step),
so the other ranks are idle and take the call at once.
"""

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

_COLLECTIVES = ("weights", "save_checkpoint")  # the trainer methods that gather shards when tp > 1


def weights_sha256(weights: dict[str, torch.Tensor]) -> str:
    """A digest of named weights, bit for bit: equal digests are equal replicas."""
    digest = hashlib.sha256()
    for name, tensor in sorted(weights.items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


class TrainerWorker:
    """One trainer rank in its own process. Rank 0 is the sync group's rank 0 (it hosts its store and
    sends the weights) and writes the checkpoints; with dp * tp > 1 every rank is a `DataParallelTrainer`,
    built only once the trainer's process group is formed (`open_dp`, then `join_dp` on every rank at once)."""

    def __init__(self, model: PreTrainedModel | str, pad_id: int, config: TrainConfig, seed: int,
                 threads: int = 1, rank: int = 0, dp: int = 1, tp: int = 1) -> None:
        torch.set_num_threads(threads)
        torch.manual_seed(seed)
        self.rank, self.dp, self.tp = rank, dp, tp
        self._args = (model_of(model), pad_id, config, seed)
        # one rank: the plain Trainer, no process group, exactly as before dp existed
        self._trainer: Trainer | None = None if dp * tp > 1 else Trainer(*self._args, clock=time.time)
        self._dp_store: Any = None
        self._store: Any = None
        self._world = 0
        self._sender: WeightSender | None = None
        self._peers: list[Any] = []  # rank 0 with tp > 1: the other ranks, called into its collectives
        self.steps_trained = 0  # train_step calls that returned here: shows every rank took part

    @property
    def trainer(self) -> Trainer:
        assert self._trainer is not None, "a dp rank trains only after join_dp"
        return self._trainer

    def open_dp(self, timeout_s: float = SYNC_TIMEOUT_S) -> tuple[str, int]:
        """Rank 0: host the trainer group's store on this node (the other ranks connect to (host, port))."""
        import ray

        host = ray.util.get_node_ip_address()
        self._dp_store = SyncGroup.host_store(host, self.dp * self.tp, timeout_s)
        return host, int(self._dp_store.port)

    def join_dp(self, host: str, port: int, timeout_s: float = SYNC_TIMEOUT_S) -> None:
        """Join the trainer's group (blocks until every rank has) and build this rank's trainer.

        Rank 0's weights are broadcast at construction, so all ranks start equal."""
        init_dp_group(self.rank, self.dp * self.tp, host, port, store=self._dp_store, timeout_s=timeout_s)
        self._trainer = DataParallelTrainer(*self._args, clock=time.time, tp=self.tp)

    def set_peers(self, peers: list[Any]) -> None:
        """Rank 0: the other ranks' actors, which it calls into the collectives of `weights` and checkpoints."""
        self._peers = list(peers)

    def join(self, method: str, *args: Any) -> None:
        """A rank other than 0: take part in rank 0's collective `method` (its result is rank 0's)."""
        if method not in _COLLECTIVES:
            raise ValueError(f"{method!r} is not a trainer collective ({', '.join(_COLLECTIVES)})")
        getattr(self.trainer, method)(*args)

    def _together(self, method: str, *args: Any) -> Any:
        """`method` of the trainer, with every other rank called into it where it is a collective."""
        import ray

        collective = isinstance(self._trainer, DataParallelTrainer) and self._trainer.collective_weights
        joined = [peer.join.remote(method, *args) for peer in self._peers] if collective else []
        result = getattr(self.trainer, method)(*args)
        ray.get(joined)
        return result

    def describe(self) -> dict[str, Any]:
        """Where this rank runs and what it holds: the driver's proof that every rank trained in step.
        The driver calls every rank at once (with tp the full weights are a collective of all of them)."""

        return {"rank": self.rank, "pid": os.getpid(), "node": self.node_id(),
                "version": self.trainer.version, "optimizer_steps": self.trainer.optimizer_steps(),
                "steps_trained": self.steps_trained, "weights_sha256": weights_sha256(self.trainer.weights())}

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
        self._sender.send(self._together("weights"), self.trainer.version)
        return self.trainer.version, t0, time.time()

    def weights(self) -> dict[str, torch.Tensor]:
        return {k: v.clone() for k, v in self._together("weights").items()}

    def save_checkpoint(self, path: str) -> None:
        self._together("save_checkpoint", path)

    def load_checkpoint(self, path: str) -> int:
        self.trainer.load_checkpoint(path)
        return self.trainer.version

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()


def start_trainers(group: Group, model: PreTrainedModel | str, pad_id: int, train: TrainConfig, seed: int,
                   timeout_s: float = SYNC_TIMEOUT_S, tp: int = 1) -> list[Any]:
    """One trainer actor per bundle of the trainer group (dp * tp of them), rank r on bundle r; with more
    than one they form the trainer's process group, whose store rank 0 hosts. Rank 0's actor first."""
    import ray

    world = group.actors
    if world % tp:
        raise ValueError(f"the trainer group has {world} bundles, not a multiple of tp={tp}")
    cls = ray.remote(TrainerWorker)
    ranks = [cls.options(**group.actor_options(r)).remote(model, pad_id, train, seed, rank=r, dp=world // tp, tp=tp)
             for r in range(world)]
    if world > 1:
        host, port = ray.get(ranks[0].open_dp.remote(timeout_s))
        # every rank must be inside init_process_group at once: issue all joins, then wait
        ray.get([rank.join_dp.remote(host, port, timeout_s) for rank in ranks])
    if tp > 1:
        ray.get(ranks[0].set_peers.remote(ranks[1:]))
    return ranks
