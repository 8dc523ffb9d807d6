"""The async loop's controller: what to admit, where to route it, what to train next, what to record.

It owns no engine and no trainer: the in-process loop (runtime.loop) and the Ray driver
(runtime.ray_loop) both drive it, so routing, batch selection and records are one code path
whatever runs the engines. It needs from an engine only the routing view below (a local
`TorchEngine` has it; the Ray driver's engine handle mirrors it from the actor's last status).

Routing is AReaL's: whole GRPO groups are admitted (a group's advantages need all its samples) while
the capacity rule (traces.staleness) allows, each sample to the accepting engine with the fewest
requests. A step trains the staleness-safe selection of the oldest completed groups.

Faults: every routed sample id stays pending until its completion arrives. Samples that were on an
engine that died are handed back (`requeue`) and routed again ahead of new groups; their group keeps
its admission version, so the capacity rule and the staleness-safe selection hold unchanged (a
regenerated sample's tokens are only fresher). A completion that is not pending (a duplicate) is
dropped and counted, and a group becomes trainable only with each of its sample ids exactly once,
so no sample is trained twice. `snapshot`/`restore` carry all of this, the prompt stream's RNG and
the records' position across a trainer restart (`checkpoint`, runtime.records).

Agentic workloads (`LoopConfig.agentic`): a sample's turn that calls the tool leaves the pending set
for runtime.episodes, which runs the call off the loop; when it is back, the next turn is routed
ahead of everything else and the sample is pending again. Only a finished episode joins its group.
A restore re-generates an episode under way from its prompt, as it does a sample on an engine.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from runtime.contracts import Task, Tokenizer
from runtime.engine import Completion, Interval, Request
from runtime.episodes import AgenticRun, Episodes, final_turn
from runtime.records import RunRecorder, commit_checkpoint, trainer_checkpoint_path
from runtime.trainer import Rollout, StepStats
from traces.records import length_histogram
from traces.routing import Router
from traces.staleness import Admitted, CapacityController


@dataclass(frozen=True)
class LoopConfig:
    steps: int
    prompts_per_step: int = 16  # GRPO groups per step; the capacity rule counts groups
    group_size: int = 16
    staleness: int = 2  # eta
    checkpoint_every: int = 0  # steps; 0 = only at the end (when out_dir is given); 1: a crash redoes one step
    max_idle_ticks: int = 1000  # a tick where nothing can move is a bug; stop rather than spin
    response_cap: int | None = None  # new tokens per sample (the workload's response cap); None: the task's
    agentic: AgenticRun | None = None  # multi-turn episodes with tool calls (runtime.episodes); None: one turn


class Routable(Protocol):
    """What routing needs from an engine."""

    name: str

    def accepting(self, version: int) -> bool: ...
    def load(self) -> int: ...
    def capacity(self) -> int: ...
    def submit(self, requests: Sequence[Request]) -> None: ...


@dataclass
class _Group:
    uid: int
    start_version: int
    prompt: str
    done: list[Completion] = field(default_factory=list)


@dataclass(frozen=True)
class _Trainable:
    """A completed group in the capacity controller's buffer: its rollouts and the sample ids behind them."""

    sids: tuple[int, ...]
    rollouts: list[Rollout]


class Controller:
    def __init__(self, task: Task, tokenizer: Tokenizer, config: LoopConfig, seed: int = 0,
                 out_dir: Path | None = None, clock: Callable[[], float] = time.perf_counter,
                 progress: Callable[[dict[str, Any]], None] | None = None,
                 identity: dict[str, Any] | None = None) -> None:
        self.task, self.tokenizer, self.config = task, tokenizer, config
        self.rng = random.Random(seed)
        self.ctl: CapacityController[_Trainable] = CapacityController(config.prompts_per_step, config.staleness)
        self.clock = clock
        self.progress = progress  # called with each step's metrics row, e.g. to print it
        self.out_dir = out_dir
        self.identity = identity or {}  # what a checkpoint must match to be resumed by this run
        self.recorder = RunRecorder(out_dir, clock())
        self.groups: dict[int, _Group] = {}
        self.history: list[StepStats] = []
        self.first_step = 0  # the version this controller started at (a resumed run's checkpoint)
        self.committed: int | None = None  # version of the last checkpoint committed (written and renamed)
        self._checkpointed: int | None = None  # version of the last checkpoint begun
        self._pending: set[int] = set()  # routed sample ids whose completion has not arrived
        self._retry: deque[Request] = deque()  # pending samples to route again (their engine died)
        self.trained_sids: list[int] = []  # every sample id handed to the trainer, in order
        self.requeued_sids: list[int] = []
        self.duplicates = 0  # completions dropped because their sample id was not pending
        self._taken: list[int] = []  # group uids of the batch in training
        self._last_step_end = self.recorder.origin
        self._lengths: dict[str, dict[str, int]] = {}
        self.episodes = (None if config.agentic is None
                         else Episodes(config.agentic, tokenizer, self.max_new_tokens, clock))
        self._resumed: deque[Request] = deque()  # episodes' next turns, their tool calls back

    @property
    def max_new_tokens(self) -> int:
        return self.config.response_cap or self.task.max_new_tokens

    @property
    def version(self) -> int:
        """The weights' version the controller has seen synced to the engines."""
        return self.ctl.version

    @property
    def done(self) -> bool:
        return self.ctl.version >= self.config.steps

    def route(self, engines: Sequence[Routable]) -> bool:
        """Route samples to re-generate first, then admit whole groups while the capacity rule and the
        accepting engines' free slots allow."""
        n = self.config.group_size
        version = self.ctl.version
        open_engines = [e for e in engines if e.accepting(version)]
        loads = [e.load() for e in open_engines]
        caps = [e.capacity() for e in open_engines]
        free = sum(max(0, c - load) for c, load in zip(caps, loads, strict=True))
        requests: list[Request] = []
        self._collect_tool_calls()
        for queue in (self._resumed, self._retry):  # samples under way first: their groups are the oldest
            while queue and len(requests) < free:
                requests.append(queue.popleft())
        while self.ctl.allowance() > 0 and free - len(requests) >= n:
            uid, start = self.ctl.admit()
            prompt = self.task.sample(self.rng)
            self.groups[uid] = _Group(uid, start, prompt)
            ids = tuple(self.tokenizer.encode(prompt))
            requests.extend(Request(uid * n + j, ids, self.max_new_tokens) for j in range(n))
        if not requests:
            return False
        # The simulator's routing rule (traces.routing). The engines' iteration times are not known
        # here, so each engine's key is its load: the rule is then least-load, ties to the first engine.
        router = Router([list(map(float, range(c + 1))) for c in caps], caps)
        for request, e in zip(requests, router.route(len(requests), [True] * len(caps), loads), strict=True):
            open_engines[e].submit([request])
            self._pending.add(request.sid)
        return True

    def requeue(self, requests: Sequence[Request]) -> None:
        """Samples lost with their engine: route them again (ahead of new groups, oldest group first)."""
        lost = sorted((r for r in requests if r.sid in self._pending), key=lambda r: r.sid)
        self._pending.difference_update(r.sid for r in lost)
        self._retry.extend(lost)
        self.requeued_sids.extend(r.sid for r in lost)

    def tools_in_flight(self) -> int:
        """Tool calls running (their samples are on no engine)."""
        return 0 if self.episodes is None else self.episodes.in_flight()

    def wait_for_tools(self, timeout_s: float = 1.0) -> None:
        """Block until a tool call is back: a loop with nothing else to do waits here rather than spin."""
        if self.episodes is not None:
            self.episodes.wait(timeout_s)

    def close(self) -> None:
        """Stop the tool calls still running (a run that has its steps does not wait for them)."""
        if self.episodes is not None:
            self.episodes.close()

    def _collect_tool_calls(self) -> None:
        if self.episodes is None:
            return
        resumed, ended, calls = self.episodes.collect()
        for call in calls:
            self.recorder.tool_call(call)
        self._resumed.extend(resumed)
        for c in ended:
            self._sample_done(c)

    def complete(self, c: Completion) -> None:
        """One sample's turn finished: a tool call starts (agentic), or the sample is done; a group whose
        samples are all in becomes trainable (rewards computed here)."""
        if c.sid not in self._pending:  # re-generated elsewhere already, or never routed: never train it twice
            self.duplicates += 1
            return
        self._pending.discard(c.sid)
        if self.episodes is not None:
            episode = self.episodes.turn_done(c, self.ctl.version)
            if episode is None:  # its tool call runs; the next turn is routed when it is back
                return
            c = episode
        self._sample_done(c)

    def _sample_done(self, c: Completion) -> None:
        group = self.groups[c.sid // self.config.group_size]
        group.done.append(c)
        if len(group.done) < self.config.group_size:
            return
        del self.groups[group.uid]
        done = sorted(group.done, key=lambda c: c.sid)  # completion order varies; keep batches reproducible
        sids = tuple(c.sid for c in done)
        n = self.config.group_size
        if sids != tuple(range(group.uid * n, (group.uid + 1) * n)):  # guards the pending bookkeeping above
            raise RuntimeError(f"group {group.uid} completed with sample ids {sids}: one missing or twice")
        rollouts = [
            Rollout(c.prompt, c.tokens, c.logprobs, c.versions,
                    self.task.reward(group.prompt, self.tokenizer.decode(final_turn(c)), c.finished), group.uid,
                    c.generated)
            for c in done
        ]
        self.ctl.complete(group.uid, group.start_version, _Trainable(sids, rollouts))

    def engine_intervals(self, name: str, intervals: Sequence[Interval]) -> None:
        for iv in intervals:
            self.recorder.interval(name, "rollout", iv.activity, iv.start, iv.end, iv.version, iv.samples)

    def ready(self) -> bool:
        """The next step may train now without breaking the staleness bound later."""
        return not self.done and self.ctl.ready(self.ctl.version)

    def take(self) -> list[Rollout]:
        units = self.ctl.take()
        self._taken = [unit.uid for unit in units]
        for unit in units:
            self.trained_sids.extend(unit.item.sids)
        batch = [r for unit in units for r in unit.item.rollouts]
        # the batch's length mix, recorded with its step: what a simulation of this run must assume
        self._lengths = {"prompt_lengths": length_histogram([len(r.prompt) for r in batch]),
                         "response_lengths": length_histogram([len(r.tokens) for r in batch])}
        return batch

    def stepped(self, stats: StepStats, train_intervals: Sequence[tuple[str, float, float]],
                sync_span: tuple[float, float], version: int) -> dict[str, Any]:
        """Record a trained and synced step; from now on routing admits at `version`. Returns the metrics row."""
        for activity, start, end in train_intervals:
            self.recorder.interval("trainer0", "trainer", activity, start, end, stats.step, stats.samples)
        self.recorder.interval("trainer0", "trainer", "sync", *sync_span, version, stats.samples)
        self.ctl.new_version(version)
        self.history.append(stats)
        now = self.clock()
        row: dict[str, Any] = {
            "step": stats.step, "samples": stats.samples, "tokens": stats.tokens,
            "mean_reward": round(stats.mean_reward, 6),
            "samples_per_s": round(stats.samples / max(now - self._last_step_end, 1e-9), 3),
            "max_staleness": stats.max_lag, "time": round(now - self.recorder.origin, 6),
            "loss": round(stats.loss, 6), "clip_fraction": round(stats.clip_fraction, 6),
            "dropped_fraction": round(stats.dropped_fraction, 6),
            "mean_behav_weight": round(stats.mean_behav_weight, 6), "grad_norm": round(stats.grad_norm, 6),
            "entropy": round(stats.entropy, 6),
            "staleness_tokens": dict(stats.lags),
            "groups": self._taken,  # GRPO group uids trained (samples uid * group_size + 0..n-1)
            **self._lengths,
        }
        self.recorder.metric(row)
        if self.progress is not None:
            self.progress(row)
        self._last_step_end = now
        return row

    def checkpoint_due(self, version: int) -> bool:
        every = self.config.checkpoint_every
        return self.out_dir is not None and bool(every) and version % every == 0

    def checkpoint(self, save_trainer: Callable[[Path], None]) -> None:
        """Commit a checkpoint at the current version (runtime.records): the trainer's file, the records,
        then the commit record with this controller's state. Call between steps, with the trainer idle."""
        path = self.trainer_file()
        save_trainer(path)
        self.prepare_commit(path)()

    def trainer_file(self) -> Path:
        assert self.out_dir is not None, "checkpoints need an out_dir"
        return trainer_checkpoint_path(self.out_dir, self.version)

    def prepare_commit(self, trainer_file: Path) -> Callable[[], None]:
        """Capture the state now (between steps); the returned call writes the records and the commit
        record, and may run later, in another thread, once the trainer's file is written."""
        assert self.out_dir is not None, "checkpoints need an out_dir"
        out, version = self.out_dir, self.version
        record = {"version": version, "trainer": str(trainer_file.relative_to(out)), "identity": self.identity,
                  "controller": self.snapshot(), "records": self.recorder.position()}
        records = self.recorder.copy()
        self._checkpointed = version

        def commit() -> None:
            records.flush()
            commit_checkpoint(out, record)
            self.committed = version

        return commit

    def final_checkpoint_due(self) -> bool:
        """At the end of a run with an out_dir: the last version needs a checkpoint unless a periodic one took it."""
        return self.out_dir is not None and self._checkpointed != self.version

    # -- state across a restart -----------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """JSON-able state: the prompt stream, admissions, groups in flight (with the samples already in)
        and completed groups not yet trained. Samples still on engines are not in it: a restore
        re-generates every sample of an unfinished group that had not completed."""
        return {
            "version": self.ctl.version, "admitted": self.ctl.admitted, "rng": _jsonable(self.rng.getstate()),
            "groups": [{"uid": g.uid, "start_version": g.start_version, "prompt": g.prompt,
                        "done": [_fields(c) for c in g.done]} for g in self.groups.values()],
            "buffer": [{"uid": a.uid, "start_version": a.start_version, "sids": list(a.item.sids),
                        "rollouts": [_fields(r) for r in a.item.rollouts]}
                       for units in self.ctl.buffer.values() for a in units],
            "trained_samples": len(self.trained_sids), "requeued": len(self.requeued_sids),
            "duplicates": self.duplicates,
        }

    def restore(self, state: dict[str, Any], recorder: RunRecorder) -> None:
        """Continue from `snapshot()`'s state and the records as of it; unfinished samples are re-routed."""
        self.rng.setstate(_tuples(state["rng"]))
        ctl = self.ctl
        ctl.version, ctl.admitted = int(state["version"]), int(state["admitted"])
        self.first_step = ctl.version
        n = self.config.group_size
        for g in state["groups"]:
            group = _Group(g["uid"], g["start_version"], g["prompt"], [_completion(c) for c in g["done"]])
            self.groups[group.uid] = group
            ctl.in_flight[group.start_version] += 1
            have = {c.sid for c in group.done}
            ids = tuple(self.tokenizer.encode(group.prompt))
            self._retry.extend(Request(sid, ids, self.max_new_tokens)
                               for sid in range(group.uid * n, (group.uid + 1) * n) if sid not in have)
        for b in state["buffer"]:
            item = _Trainable(tuple(b["sids"]), [_rollout(r) for r in b["rollouts"]])
            ctl.buffer.setdefault(b["start_version"], []).append(Admitted(b["start_version"], b["uid"], item))
        self.duplicates = int(state.get("duplicates", 0))
        self.committed = self._checkpointed = ctl.version
        self.recorder = recorder
        self._last_step_end = self.clock()


def _fields(record: Completion | Rollout) -> dict[str, Any]:
    """A flat dataclass's fields (tuples stay tuples until JSON): dataclasses.asdict deep-copies every
    tuple, ~10x slower, and a checkpoint every step snapshots hundreds of samples on the driver's path."""
    return {f.name: getattr(record, f.name) for f in dataclasses.fields(record)}


def _jsonable(value: Any) -> Any:
    return [_jsonable(v) for v in value] if isinstance(value, tuple | list) else value


def _tuples(value: Any) -> Any:
    """random.Random.setstate wants tuples where JSON gave lists."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _completion(d: dict[str, Any]) -> Completion:
    return Completion(d["sid"], tuple(d["prompt"]), tuple(d["tokens"]), tuple(d["logprobs"]), tuple(d["versions"]),
                      bool(d["finished"]), tuple(d.get("generated", ())))


def _rollout(d: dict[str, Any]) -> Rollout:
    return Rollout(tuple(d["prompt"]), tuple(d["tokens"]), tuple(d["logprobs"]), tuple(d["versions"]),
                   float(d["reward"]), int(d["group"]), tuple(d.get("generated", ())))
