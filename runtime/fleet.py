"""The fleet of rollout engines on Ray: the driver's handles, spawning engine actors on their bundles, joining
them to the weight-sync group with trainer rank 0, and replacing engines that die.

A dead engine's slot gets a new actor on the same placement-group bundle, seeded anew for each
restart; it takes work only once `EngineFleet.admit` finds its constructor done (the driver then
sends it the current weights).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedModel

from runtime.contracts import Tokenizer
from runtime.engine import Completion, Request
from runtime.engine_factory import EngineFactory, SpecEngines
from runtime.engine_spec import EngineSpec
from runtime.engine_worker import EngineStatus
from runtime.placement import Group
from runtime.ray_futures import gather
from runtime.settings import MAX_ENGINE_RESTARTS, SYNC_TIMEOUT_S
from runtime.sync import DEFAULT_BUCKET_BYTES
from runtime.trainer import TrainConfig
from runtime.trainer_worker import start_trainers

Spawn = Callable[[int, int], Any]  # spawn(slot index, restart count): a new engine actor on that slot's bundle


class EngineHandle:
    """The driver's view of one engine actor: routing reads the last status, submissions wait for its next step."""

    def __init__(self, name: str, actor: Any, status: EngineStatus, index: int = 0, ranks: int = 1) -> None:
        self.name, self.actor, self.status = name, actor, status
        self.index = index  # its slot: a replacement goes on the same placement-group bundle
        self.ranks = ranks  # its ranks in the sync group: one per vLLM worker (its tensor-parallel size)
        self._outbox: list[Request] = []
        self.inflight: dict[int, Request] = {}  # routed here, not completed: what its death would lose

    def accepting(self, version: int) -> bool:
        return self.status.accepts == version

    def load(self) -> int:
        return self.status.load + len(self._outbox)

    def capacity(self) -> int:
        return self.status.capacity

    def idle(self) -> bool:
        return self.status.idle and not self._outbox

    def submit(self, requests: Sequence[Request]) -> None:
        self._outbox.extend(requests)
        self.inflight.update((r.sid, r) for r in requests)

    def completed(self, completions: Sequence[Completion]) -> None:
        for c in completions:
            self.inflight.pop(c.sid, None)

    def step(self) -> Any:
        """Start one iteration on the actor with what was routed since the last; returns its future."""
        requests, self._outbox = self._outbox, []
        return self.actor.step.remote(requests)


def engine_spawner(groups: Iterable[Group], model: PreTrainedModel | str, tokenizer: Tokenizer, seed: int,
                   max_batch: int | Sequence[int], interruptible: bool, engines: EngineFactory | None = None) -> Spawn:
    """`spawn(index, restart)`: an engine actor on slot `index` (its group's bundle), seeded per restart.

    `max_batch`: running sequences per engine, one figure or one per rollout group (the plan's caps);
    `engines`: the factory that builds them (torch engines of `model` by default); each gets its group's TP."""
    rollout = [g for g in groups if g.role == "rollout"]
    caps = [max_batch] * len(rollout) if isinstance(max_batch, int) else list(max_batch)
    factory = engines or SpecEngines(EngineSpec("torch", model, tokenizer.eos_id, tokenizer.pad_id, max(caps),
                                                interruptible))
    slots = [(g, i, cap) for g, cap in zip(rollout, caps, strict=True) for i in range(g.actors)]

    def spawn(index: int, restart: int = 0) -> Any:
        group, i, cap = slots[index]
        return factory.spawn(group.actor_options(i), f"engine{index}", seed * 1000 + index + 1 + 100_003 * restart,
                             cap, tp=group.per_actor)

    return spawn


def join_sync_group(trainer: Any, engines: Sequence[Any], host: str, port: int, bucket_bytes: int,
                    timeout_s: float, ranks: Sequence[int] | None = None) -> list[Any]:
    """The joins of trainer rank 0 and `engines` to the sync group whose store the trainer opened at
    (host, port), as futures: every rank must be inside the group's constructor at once, so all the
    joins are issued before any is waited on. `ranks`: each engine's ranks (default one each); engine
    k's first rank follows the ranks of the engines before it."""
    ranks = list(ranks) if ranks is not None else [1] * len(engines)
    world = 1 + sum(ranks)
    firsts = [1 + sum(ranks[:k]) for k in range(len(engines))]
    return [trainer.join_sync.remote(bucket_bytes, timeout_s),
            *(a.join_sync.remote(host, port, first, world, bucket_bytes, timeout_s)
              for first, a in zip(firsts, engines, strict=True))]


def start_fleet(groups: Iterable[Group], model: PreTrainedModel | str, tokenizer: Tokenizer,
                train: TrainConfig, seed: int, max_batch: int, interruptible: bool,
                bucket_bytes: int = DEFAULT_BUCKET_BYTES, timeout_s: float = SYNC_TIMEOUT_S,
                spawn: Spawn | None = None, tp: int = 1) -> tuple[list[EngineHandle], list[Any]]:
    """Engines and every trainer rank on their placement groups; the engines and trainer rank 0 (alone:
    the other ranks hold the same weights) joined in one sync group. (engine handles, trainer ranks).
    `spawn`: the engine_spawner of these arguments, where the caller keeps one to replace engines. `tp`: the
    trainer's tensor parallelism (its group holds dp * tp bundles)."""
    import ray

    spawn = spawn or engine_spawner(groups, model, tokenizer, seed, max_batch, interruptible)
    groups = list(groups)
    engines = sum(g.actors for g in groups if g.role == "rollout")
    actors = [spawn(k) for k in range(engines)]
    ranks = start_trainers(next(g for g in groups if g.role == "train"), model, tokenizer.pad_id, train, seed,
                           timeout_s, tp)
    trainer = ranks[0]
    sync_ranks = ray.get([a.sync_ranks.remote() for a in actors])  # each engine's ranks in the sync group
    host, port = ray.get(trainer.open_sync.remote(1 + sum(sync_ranks), timeout_s))
    ray.get(join_sync_group(trainer, actors, host, port, bucket_bytes, timeout_s, sync_ranks))
    statuses = ray.get([a.status.remote() for a in actors])
    handles = [EngineHandle(f"engine{k}", a, st, k, r)
               for k, (a, st, r) in enumerate(zip(actors, statuses, sync_ranks, strict=True))]
    return handles, ranks


def start_actors(groups: Iterable[Group], model: PreTrainedModel | str, tokenizer: Tokenizer,
                 train: TrainConfig, seed: int, max_batch: int, interruptible: bool,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES, timeout_s: float = SYNC_TIMEOUT_S
                 ) -> tuple[list[EngineHandle], Any]:
    """Engines and trainer rank 0 of a dp = 1 plan, joined in one sync group (start_fleet for any dp)."""
    handles, ranks = start_fleet(groups, model, tokenizer, train, seed, max_batch, interruptible, bucket_bytes,
                                 timeout_s)
    if len(ranks) != 1:
        raise ValueError(f"start_actors returns one trainer; this plan has {len(ranks)} ranks (use start_fleet)")
    return handles, ranks[0]


@dataclass(frozen=True)
class Replacement:
    """An engine actor started for a dead one, not yet taking work."""

    handle: EngineHandle
    ready: Any  # future of the new actor's first status: resolves once its constructor has run
    since: float  # when the engine it replaces was found dead


class EngineFleet:
    """The driver's live engines and the replacements starting for dead ones.

    `spawn` starts a replacement engine actor for a slot; without it a dead engine is not replaced
    and the run continues on the others. `regroup`: the sync group lost or gained a member, so the
    driver must rebuild it before the next broadcast."""

    def __init__(self, engines: list[EngineHandle], spawn: Spawn | None, clock: Callable[[], float]) -> None:
        self.engines = engines
        self.spawn = spawn
        self.clock = clock
        self.restarts = 0
        self.regroup = False
        self._starting: list[Replacement] = []

    @property
    def starting(self) -> bool:
        return bool(self._starting)

    def actors(self) -> list[Any]:
        """Every engine actor, live or starting (what a run kills at its end)."""
        return [*(e.actor for e in self.engines), *(r.handle.actor for r in self._starting)]

    def lost(self, engine: EngineHandle) -> list[Request]:
        """Take a dead engine out and start its replacement; returns its samples in flight, to route again."""
        self.engines.remove(engine)
        self.regroup = True
        if self.spawn is not None:
            self.restarts += 1
            if self.restarts > MAX_ENGINE_RESTARTS:
                raise RuntimeError(f"rollout engines died {self.restarts} times in this run; giving up")
            actor = self.spawn(engine.index, self.restarts)
            handle = EngineHandle(engine.name, actor, EngineStatus(None, 0, 0, True), engine.index, engine.ranks)
            self._starting.append(Replacement(handle, actor.status.remote(), self.clock()))
        return list(engine.inflight.values())

    def admit(self, block: bool) -> list[Replacement]:
        """Replacements whose actors are up join the engines (`block`: wait for the first); those admitted.
        One that died too is lost in turn, and another starts."""
        import ray

        if not self._starting:
            return []
        futures = [r.ready for r in self._starting]
        ready, _ = ray.wait(futures, num_returns=1 if block else len(futures), timeout=None if block else 0)
        admitted = []
        for replacement in [r for r in self._starting if r.ready in ready]:
            self._starting.remove(replacement)
            status = gather([replacement.ready])[0]
            self.engines.append(replacement.handle)
            if isinstance(status, Exception):  # it never took work: nothing of it to route again
                self.lost(replacement.handle)
                continue
            replacement.handle.status = status
            admitted.append(replacement)
            self.regroup = True
        return admitted
