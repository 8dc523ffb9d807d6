"""Rollout engines: generate responses with behaviour logprobs, load new weights with a version.

`RolloutEngine` is the interface the loop drives (`TorchEngine` below and runtime.vllm_engine's
`VllmEngine` implement it). It is step-wise on purpose: one `step()` is one continuous-batching
iteration, so a scheduler can interleave engines and a trainer in one process, run each in its own
thread, or drive a remote actor, without the engine knowing which. `SyncedEngine` adds what a Ray
engine actor (runtime.engine_worker) needs: joining the trainer's weight-sync group and taking part
in its broadcasts (TorchEngine receives in its own process, VllmEngine inside vLLM's workers).

`TorchEngine` is continuous batching over a transformers causal LM with a KV cache:
- every iteration, running sequences decode one token together (one forward of batch B, length 1);
- waiting requests join as soon as slots are free: they are prefilled together (left-padded to
  their longest context) and their cache rows are merged into the running batch, so short and
  long requests never wait for each other (no static batch that lasts as long as its longest);
- finished rows leave the batch at once, and all-padding columns at the left are trimmed.
Left padding with an explicit attention mask and position ids (count of real tokens before) makes
a row's logits independent of what it is batched with, so behaviour logprobs equal a plain forward
of the same weights over the same tokens (checked to 1e-4 by the tests).

Weights: `load_weights` queues them; they apply at the next iteration boundary. Interruptible
engines (AReaL's interruptible rollouts) apply at once and re-prefill running sequences with the new
weights, so every token's logprob belongs to exactly the version recorded for it. Otherwise the
engine stops admitting, drains its batch, then loads (the simulator's non-interruptible engine).
"""

from __future__ import annotations

import copy
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence, Sized
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from transformers import DynamicCache, PreTrainedModel

from runtime.settings import SYNC_TIMEOUT_S
from runtime.sync import DEFAULT_BUCKET_BYTES, SyncGroup, WeightReceiver


@dataclass(frozen=True)
class Request:
    sid: int  # the caller's sample id, returned with the completion
    prompt: tuple[int, ...]  # token ids, bos included
    max_new_tokens: int


@dataclass(frozen=True)
class Completion:
    sid: int
    prompt: tuple[int, ...]
    tokens: tuple[int, ...]  # the response, eos included when it ended with one
    logprobs: tuple[float, ...]  # behaviour logprob of each response token, at the engine's temperature
    versions: tuple[int, ...]  # weight version that produced each token
    finished: bool  # ended with eos (False: cut at max_new_tokens)
    # per token, whether the policy sampled it; () = all of them. A multi-turn episode's tool results are
    # False (runtime.episodes): they carry no logprob and are masked out of the loss
    generated: tuple[bool, ...] = ()


@dataclass(frozen=True)
class Interval:
    """One busy span of an engine, in the simulator's timeline vocabulary."""

    activity: str  # prefill | decode | weight_load | reprefill
    start: float
    end: float
    version: int
    samples: int


@dataclass(frozen=True)
class EngineStats:
    name: str
    version: int
    running: int
    waiting: int
    completed: int
    prefill_tokens: int
    generated_tokens: int
    iterations: int
    weight_loads: int
    busy_seconds: float


class RolloutEngine(Protocol):
    name: str

    @property
    def version(self) -> int: ...
    def submit(self, requests: Sequence[Request]) -> None: ...
    def step(self) -> list[Completion]: ...
    def load_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None: ...
    def accepting(self, version: int) -> bool: ...
    def load(self) -> int: ...
    def capacity(self) -> int: ...
    def idle(self) -> bool: ...
    def stats(self) -> EngineStats: ...
    def drain_intervals(self) -> list[Interval]: ...
    def close(self) -> None: ...


class SyncedEngine(RolloutEngine, Protocol):
    """A rollout engine that is a member of the trainer's weight-sync group (runtime.sync)."""

    @property
    def target_version(self) -> int: ...
    @property
    def sync_ranks(self) -> int: ...
    def join_sync(self, host: str, port: int, rank: int, world_size: int, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                  timeout_s: float = SYNC_TIMEOUT_S) -> None: ...
    def receive_weights(self) -> int: ...


def generate(engine: RolloutEngine, requests: Sequence[Request]) -> list[Completion]:
    """Run `requests` to completion on an otherwise idle engine; completions in request order."""
    engine.submit(requests)
    done: dict[int, Completion] = {}
    while not engine.idle():
        for c in engine.step():
            done[c.sid] = c
    return [done[r.sid] for r in requests]


class EngineBase:
    """What every rollout engine keeps the same way: the waiting queue, the weights queued for the next
    iteration boundary, the version, counters and busy intervals. Subclasses hold their running rows
    in `_rows` (anything with a length) and implement `step` and `load_weights`."""

    def __init__(self, name: str, max_batch: int, interruptible: bool, version: int,
                 clock: Callable[[], float]) -> None:
        self.name = name
        self.max_batch = max_batch
        self.interruptible = interruptible
        self._version = version
        self._clock = clock
        self._waiting: deque[Request] = deque()
        self._rows: Sized = ()
        self._pending: tuple[Any, int] | None = None  # (weights, version) applied at the next boundary
        self._intervals: list[Interval] = []
        self._completed = self._prefill_tokens = self._generated = self._iterations = self._loads = 0
        self._busy = 0.0

    @property
    def version(self) -> int:
        return self._version

    @property
    def target_version(self) -> int:
        """The version the engine holds once its queued weights apply (its version if none are queued)."""
        return self._version if self._pending is None else self._pending[1]

    def submit(self, requests: Sequence[Request]) -> None:
        self._waiting.extend(requests)

    def accepting(self, version: int) -> bool:
        """New requests would start with weights of `version` (a draining engine would run them stale)."""
        if self._pending is None:
            return self._version == version
        return self.interruptible and self._pending[1] == version

    def load(self) -> int:
        return len(self._rows) + len(self._waiting)

    def capacity(self) -> int:
        return self.max_batch

    def idle(self) -> bool:
        return not self._rows and not self._waiting

    def stats(self) -> EngineStats:
        return EngineStats(self.name, self._version, len(self._rows), len(self._waiting), self._completed,
                           self._prefill_tokens, self._generated, self._iterations, self._loads, self._busy)

    def drain_intervals(self) -> list[Interval]:
        out, self._intervals = self._intervals, []
        return out

    def close(self) -> None:
        """Release what the engine holds outside this process's memory (nothing, unless a subclass says)."""

    def _record(self, activity: str, start: float, samples: int) -> None:
        end = self._clock()
        self._busy += end - start
        self._intervals.append(Interval(activity, start, end, self._version, samples))


@dataclass
class Row:
    """A running sequence (mutable, engine-private): what it has generated so far."""

    request: Request
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)

    def context(self) -> list[int]:
        return [*self.request.prompt, *self.tokens]


class TorchEngine(EngineBase):
    def __init__(self, model: PreTrainedModel, eos_id: int, pad_id: int, name: str = "engine0", max_batch: int = 256,
                 temperature: float = 1.0, seed: int = 0, interruptible: bool = True, version: int = 0,
                 clock: Callable[[], float] = time.perf_counter, device: str | torch.device = "cpu") -> None:
        super().__init__(name, max_batch, interruptible, version, clock)
        # a private copy: the trainer's updates reach the engine only through load_weights, as on a cluster
        self.device = torch.device(device)
        self.model = copy.deepcopy(model).to(self.device).eval()
        self.eos_id, self.pad_id = eos_id, pad_id
        self.temperature = temperature
        self._gen = torch.Generator(device=self.device).manual_seed(seed)
        self._rows: list[Row] = []  # in cache row order
        self._cache: DynamicCache | None = None
        self._mask = torch.zeros(0, 0, dtype=torch.long, device=self.device)  # [rows, cached columns]: 1 = real
        self._pos = torch.zeros(0, dtype=torch.long, device=self.device)  # position id of each row's last token
        self._pending: tuple[dict[str, torch.Tensor], int] | None = None
        self._receiver: WeightReceiver | None = None

    # -- interface (the rest is EngineBase's) -------------------------------------------------------
    def load_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        # copied now: the sender keeps training its tensors in place while these wait for a boundary
        self._pending = ({k: v.detach().clone() for k, v in state_dict.items()}, version)

    # -- the runtime's sync group ----------------------------------------------------------------
    @property
    def sync_ranks(self) -> int:
        return 1  # the model runs in this process: one receiving rank

    def join_sync(self, host: str, port: int, rank: int, world_size: int, bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                  timeout_s: float = SYNC_TIMEOUT_S) -> None:
        """Join a (new) sync group as `rank`; a previous group, broken by a dead rank, is dropped."""
        self._receiver = None
        group = SyncGroup(host, port, rank, world_size, timeout_s=timeout_s)
        self._receiver = WeightReceiver(group, self.model.state_dict(), bucket_bytes)

    def receive_weights(self) -> int:
        """Take part in one broadcast; the weights apply at the next iteration boundary. A version the
        engine holds or has queued is not queued again (after a fault the group re-broadcasts the
        current version for a new engine: reloading would make the others re-prefill for nothing)."""
        if self._receiver is None:
            raise RuntimeError("join_sync first")
        state, version = self._receiver.receive()
        if version != self.target_version:
            self.load_weights(state, version)
        return version

    # -- one iteration ---------------------------------------------------------------------------
    @torch.inference_mode()
    def step(self) -> list[Completion]:
        logits: torch.Tensor | None = None  # next-token logits of every running row, once known
        if self._pending is not None and (self.interruptible or not self._rows):
            logits = self._swap_weights()
        if self._rows and logits is None:
            logits = self._decode()
        admit: list[Request] = []
        if self._pending is None:  # a draining engine takes nothing new
            while self._waiting and len(self._rows) + len(admit) < self.max_batch:
                admit.append(self._waiting.popleft())
        if admit:
            fresh = self._prefill([Row(r) for r in admit], "prefill")
            logits = fresh if logits is None else torch.cat([logits, fresh])
        if logits is None:
            return []
        return self._sample(logits)

    def _swap_weights(self) -> torch.Tensor | None:
        assert self._pending is not None
        state, version = self._pending
        self._pending = None
        t0 = self._clock()
        self.model.load_state_dict(state)
        self._version = version
        self._loads += 1
        self._record("weight_load", t0, len(self._rows))
        if not self._rows:
            return None
        # AReaL-style interrupt: keep the tokens, recompute the cache with the new weights
        rows, self._rows, self._cache = self._rows, [], None
        self._mask, self._pos = self._mask[:0, :0], self._pos[:0]
        return self._prefill(rows, "reprefill")

    def _prefill(self, rows: list[Row], activity: str) -> torch.Tensor:
        """Run the rows' full contexts (left-padded together), append them to the batch; next-token logits."""
        t0 = self._clock()
        contexts = [r.context() for r in rows]
        width = max(len(c) for c in contexts)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros(len(rows), width, dtype=torch.long)
        for i, c in enumerate(contexts):
            ids[i, width - len(c):] = torch.tensor(c)
            mask[i, width - len(c):] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)  # built on the host, one copy each
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=DynamicCache(),
                         use_cache=True, logits_to_keep=1)
        self._merge(rows, out.cache, mask, positions[:, -1] + 1)
        self._prefill_tokens += int(mask.sum())
        self._record(activity, t0, len(rows))
        return out.logits[:, -1].float()

    def _merge(self, rows: list[Row], cache: DynamicCache, mask: torch.Tensor, next_pos: torch.Tensor) -> None:
        """Append new cache rows under the running ones, left-padding whichever is shorter."""
        if self._cache is None:
            self._rows, self._cache, self._mask, self._pos = list(rows), cache, mask, next_pos
            return
        width = max(self._mask.shape[1], mask.shape[1])

        def left_pad(t: torch.Tensor, dim: int) -> torch.Tensor:
            missing = width - t.shape[dim]
            if missing == 0:
                return t
            shape = list(t.shape)
            shape[dim] = missing
            return torch.cat([t.new_zeros(shape), t], dim=dim)

        for old, new in zip(self._cache.layers, cache.layers, strict=True):
            old.keys = torch.cat([left_pad(old.keys, -2), left_pad(new.keys, -2)])
            old.values = torch.cat([left_pad(old.values, -2), left_pad(new.values, -2)])
        self._mask = torch.cat([left_pad(self._mask, 1), left_pad(mask, 1)])
        self._pos = torch.cat([self._pos, next_pos])
        self._rows.extend(rows)

    def _decode(self) -> torch.Tensor:
        """Feed every row's last sampled token; one forward of batch B and length 1."""
        assert self._cache is not None
        t0 = self._clock()
        last = torch.tensor([[r.tokens[-1]] for r in self._rows], device=self.device)
        self._mask = torch.cat([self._mask, self._mask.new_ones(len(self._rows), 1)], dim=1)
        out = self.model(input_ids=last, attention_mask=self._mask, position_ids=self._pos[:, None],
                         cache=self._cache, use_cache=True)
        self._pos = self._pos + 1
        self._record("decode", t0, len(self._rows))
        return out.logits[:, -1].float()

    def _sample(self, logits: torch.Tensor) -> list[Completion]:
        logp = torch.log_softmax(logits / self.temperature, dim=-1)
        picked = torch.multinomial(logp.exp(), 1, generator=self._gen).squeeze(1)
        picked_logp = logp.gather(1, picked[:, None]).squeeze(1)
        done: list[Completion] = []
        keep: list[int] = []
        for i, (row, tok, lp) in enumerate(zip(self._rows, picked.tolist(), picked_logp.tolist(), strict=True)):
            row.tokens.append(tok)
            row.logprobs.append(lp)
            row.versions.append(self._version)
            finished = tok == self.eos_id
            if finished or len(row.tokens) >= row.request.max_new_tokens:
                req = row.request
                done.append(Completion(req.sid, req.prompt, tuple(row.tokens), tuple(row.logprobs),
                                       tuple(row.versions), finished))
            else:
                keep.append(i)
        self._iterations += 1
        self._generated += len(self._rows)
        self._completed += len(done)
        if done:
            self._keep(keep)
        return done

    def _keep(self, keep: list[int]) -> None:
        """Drop finished rows from the batch, then the all-padding columns on the left."""
        self._rows = [self._rows[i] for i in keep]
        if not keep:
            self._cache, self._mask, self._pos = None, self._mask[:0, :0], self._pos[:0]
            return
        assert self._cache is not None
        index = torch.tensor(keep, device=self.device)
        used = self._mask[index].any(0).nonzero()
        first = int(used[0]) if len(used) else self._mask.shape[1]
        self._mask, self._pos = self._mask[index, first:], self._pos[index]
        for layer in self._cache.layers:
            layer.keys = layer.keys[index, :, first:]
            layer.values = layer.values[index, :, first:]
