"""The asynchronous RL loop, in one process: engines generate while the trainer trains on what is ready.

Scheduling (this slice): a deterministic round-robin. Each tick routes what the capacity rule
allows, runs one continuous-batching iteration on every engine, and lets the trainer take a step
as soon as the staleness-safe selection says one is ready; new weights (with their version) then
go to every engine. Generation and training interleave rather than overlap in wall time, but
the logic is the asynchronous one: engines run ahead of the trainer by up to eta versions, samples
are trained up to eta versions stale, and the decoupled loss corrects for it. The same engine and
trainer objects are meant to run in threads or Ray actors next, with this loop's routing and
selection unchanged.

Routing is AReaL's: whole GRPO groups are admitted (a group's advantages need all its samples) while
the capacity rule allows, each sample to the accepting engine with the fewest requests.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from runtime.engine import Completion, Request, RolloutEngine, TorchEngine, generate
from runtime.model import CharTokenizer, build_model, save_model, tiny_llama_config
from runtime.records import RunRecorder
from runtime.task import AdditionTask
from runtime.trainer import Rollout, StepStats, TrainConfig, Trainer
from traces.staleness import CapacityController


@dataclass(frozen=True)
class LoopConfig:
    steps: int
    prompts_per_step: int = 16  # GRPO groups per step; the capacity rule counts groups
    group_size: int = 16
    staleness: int = 2  # eta
    checkpoint_every: int = 0  # steps; 0 = only at the end (when out_dir is given)
    max_idle_ticks: int = 1000  # a tick where nothing can move is a bug; stop rather than spin


@dataclass(frozen=True)
class RunResult:
    steps: int
    rewards: tuple[float, ...]  # mean training reward of each step's batch
    eval_before: float  # mean reward of the untrained model on the evaluation set (sampled)
    eval_after: float  # the same after training
    uniform_chance: float  # mean reward of uniformly random answers
    staleness_tokens: tuple[tuple[int, int], ...]  # (version lag, trained tokens), over the run
    samples: int  # trained
    seconds: float
    out_dir: Path | None

    @property
    def chance(self) -> float:
        """The baseline a learning claim is measured against: the better of untrained and uniform."""
        return max(self.eval_before, self.uniform_chance)

    @property
    def max_staleness(self) -> int:
        return max((lag for lag, _ in self.staleness_tokens), default=0)

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds if self.seconds > 0 else 0.0


@dataclass
class _Group:
    uid: int
    start_version: int
    prompt: str
    done: list[Completion] = field(default_factory=list)


class AsyncLoop:
    def __init__(self, task: AdditionTask, tokenizer: CharTokenizer, engines: list[RolloutEngine], trainer: Trainer,
                 config: LoopConfig, seed: int = 0, out_dir: Path | None = None,
                 clock: Callable[[], float] = time.perf_counter,
                 progress: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.task, self.tokenizer, self.engines, self.trainer, self.config = task, tokenizer, engines, trainer, config
        self.rng = random.Random(seed)
        self.ctl: CapacityController[list[Rollout]] = CapacityController(config.prompts_per_step, config.staleness)
        self.clock = clock
        self.progress = progress  # called with each step's metrics row, e.g. to print it
        self.out_dir = out_dir
        self.recorder = RunRecorder(out_dir, clock())
        self.groups: dict[int, _Group] = {}
        self.history: list[StepStats] = []
        self._last_step_end = self.recorder.origin

    def run(self) -> list[StepStats]:
        idle = 0
        while self.trainer.version < self.config.steps:
            moved = self._route()
            for engine in self.engines:
                for c in engine.step():
                    self._complete(c)
                    moved = True
                for iv in engine.drain_intervals():
                    self.recorder.interval(engine.name, "rollout", iv.activity, iv.start, iv.end, iv.version,
                                           iv.samples)
            if self.ctl.ready(self.trainer.version):
                self._train()
                moved = True
            idle = 0 if moved or not all(e.idle() for e in self.engines) else idle + 1
            if idle > self.config.max_idle_ticks:
                raise RuntimeError("async loop stalled: no allowance, no engine work, no ready batch")
        if self.out_dir is not None:
            self.trainer.save_checkpoint(self.out_dir / "checkpoint.pt")
        self.recorder.flush()
        return self.history

    def _route(self) -> bool:
        """Admit whole groups while the capacity rule and the accepting engines' free slots allow."""
        n = self.config.group_size
        version = self.ctl.version
        open_engines = [e for e in self.engines if e.accepting(version)]
        loads = {e.name: e.load() for e in open_engines}
        routed = False
        while self.ctl.allowance() > 0 and sum(e.capacity() - loads[e.name] for e in open_engines) >= n:
            uid, start = self.ctl.admit()
            prompt = self.task.sample(self.rng)
            self.groups[uid] = _Group(uid, start, prompt)
            ids = tuple(self.tokenizer.encode(prompt))
            for j in range(n):
                target = min((e for e in open_engines if loads[e.name] < e.capacity()), key=lambda e: loads[e.name])
                target.submit([Request(uid * n + j, ids, self.task.max_new_tokens)])
                loads[target.name] += 1
            routed = True
        return routed

    def _complete(self, c: Completion) -> None:
        group = self.groups[c.sid // self.config.group_size]
        group.done.append(c)
        if len(group.done) < self.config.group_size:
            return
        del self.groups[group.uid]
        rollouts = [
            Rollout(c.prompt, c.tokens, c.logprobs, c.versions,
                    self.task.reward(group.prompt, self.tokenizer.decode(c.tokens), c.finished), group.uid)
            for c in sorted(group.done, key=lambda c: c.sid)  # completion order varies; keep batches reproducible
        ]
        self.ctl.complete(group.uid, group.start_version, rollouts)

    def _train(self) -> None:
        batch = [r for unit in self.ctl.take() for r in unit.item]
        stats = self.trainer.train_step(batch)
        for activity, start, end in self.trainer.last_intervals:
            self.recorder.interval("trainer0", "trainer", activity, start, end, stats.step, len(batch))
        version = self.trainer.version
        t0 = self.clock()
        weights = self.trainer.weights()
        for engine in self.engines:
            engine.load_weights(weights, version)
        self.recorder.interval("trainer0", "trainer", "sync", t0, self.clock(), version, len(batch))
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
        }
        self.recorder.metric(row)
        if self.progress is not None:
            self.progress(row)
        self._last_step_end = now
        every = self.config.checkpoint_every
        if self.out_dir is not None and every and version % every == 0:
            self.trainer.save_checkpoint(self.out_dir / "checkpoint.pt")
            self.recorder.flush()


def evaluate(model: PreTrainedModel, task: AdditionTask, tokenizer: CharTokenizer, samples_per_prompt: int = 16,
             seed: int = 12345) -> float:
    """Expected reward under the task's prompt distribution, every prompt sampled at temperature 1.

    Sampled rather than greedy: this is the policy being trained, and its chance level is defined
    the same way.
    """
    engine = TorchEngine(model, tokenizer.eos_id, tokenizer.pad_id, name="eval", max_batch=1024, seed=seed)
    weighted = task.eval_weights()
    requests = [Request(i * samples_per_prompt + j, tuple(tokenizer.encode(p)), task.max_new_tokens)
                for i, (p, _) in enumerate(weighted) for j in range(samples_per_prompt)]
    total = 0.0
    for c in generate(engine, requests):
        prompt, weight = weighted[c.sid // samples_per_prompt]
        total += weight * task.reward(prompt, tokenizer.decode(c.tokens), c.finished)
    return total / samples_per_prompt


def run_toy(steps: int, engines: int = 2, staleness: int = 2, seed: int = 0, out_dir: str | Path | None = None,
            prompts_per_step: int = 16, group_size: int = 16, train: TrainConfig | None = None,
            interruptible: bool = True, max_batch: int = 256, task: AdditionTask | None = None, hidden: int = 64,
            layers: int = 2, progress: Callable[[dict[str, Any]], None] | None = None) -> RunResult:
    """Train the tiny Llama on digit addition with async GRPO: one trainer, `engines` torch engines.

    Defaults are the measured ones that learn on two CPU cores in well under a minute: operands 0..4
    (9 answers, chance 1/9; with 0..9 and 19 answers the reward still crawls at ~0.1 after 200 steps:
    RL from a random model gets ~1/19 of a label per sample, too little information for the budget),
    16 prompts x 16 samples per step (bigger groups find a rewarded answer more often), Adam at 1e-3
    (2e-3 learns faster, then collapses) decaying linearly to 1e-4 by the last step (at a constant
    rate the policy keeps flipping answers late in the run), and a small entropy bonus.
    """
    out = Path(out_dir) if out_dir is not None else None
    task, tokenizer = task or AdditionTask(max_operand=4), CharTokenizer()
    train = train or TrainConfig(entropy_coef=0.01, decay_steps=steps)
    model = build_model(tiny_llama_config(tokenizer, hidden=hidden, layers=layers, intermediate=4 * hidden), seed=seed)
    if out is not None:
        save_model(model, tokenizer, out / "initial_model")  # the HF folder a vLLM engine would load
    before = evaluate(model, task, tokenizer)
    pool: list[RolloutEngine] = [
        TorchEngine(model, tokenizer.eos_id, tokenizer.pad_id, name=f"engine{i}", max_batch=max_batch,
                    seed=seed * 1000 + i + 1, interruptible=interruptible)
        for i in range(engines)
    ]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        trainer = Trainer(model, tokenizer.pad_id, train, seed=seed)
        loop = AsyncLoop(task, tokenizer, pool, trainer,
                         LoopConfig(steps, prompts_per_step, group_size, staleness), seed=seed, out_dir=out,
                         progress=progress)
        history = loop.run()
    seconds = loop.clock() - loop.recorder.origin
    after = evaluate(trainer.model, task, tokenizer)
    lags: Counter[int] = Counter()
    for s in history:
        lags.update(dict(s.lags))
    return RunResult(
        steps=len(history), rewards=tuple(s.mean_reward for s in history), eval_before=before, eval_after=after,
        uniform_chance=task.uniform_chance, staleness_tokens=tuple(sorted(lags.items())),
        samples=sum(s.samples for s in history), seconds=seconds, out_dir=out,
    )
