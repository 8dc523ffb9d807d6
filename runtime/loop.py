"""The asynchronous RL loop, in one process: engines generate while the trainer trains on what is ready.

Scheduling: a deterministic round-robin. Each tick routes what the capacity rule allows, runs one
continuous-batching iteration on every engine, and lets the trainer take a step as soon as the
staleness-safe selection says one is ready; new weights (with their version) then go to every
engine. Generation and training interleave rather than overlap in wall time, but the logic is the
asynchronous one: engines run ahead of the trainer by up to eta versions, samples are trained up
to eta versions stale, and the decoupled loss corrects for it. Routing, selection and records live
in runtime.controller, shared with the Ray driver (runtime.ray_loop), where engines and trainer
are separate processes and do overlap.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from runtime.controller import Controller, LoopConfig
from runtime.engine import Request, RolloutEngine, TorchEngine, generate
from runtime.model import CharTokenizer, build_model, save_model, tiny_llama_config
from runtime.records import RunRecorder
from runtime.task import AdditionTask
from runtime.trainer import StepStats, TrainConfig, Trainer

__all__ = ["AsyncLoop", "LoopConfig", "RunResult", "evaluate", "run_toy", "summarize"]


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


class AsyncLoop:
    """The controller driven in one process: a deterministic round-robin over engines and trainer."""

    def __init__(self, task: AdditionTask, tokenizer: CharTokenizer, engines: list[RolloutEngine], trainer: Trainer,
                 config: LoopConfig, seed: int = 0, out_dir: Path | None = None,
                 clock: Callable[[], float] = time.perf_counter,
                 progress: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.engines, self.trainer, self.config = engines, trainer, config
        self.control = Controller(task, tokenizer, config, seed, out_dir, clock, progress)
        self.clock = clock
        self.out_dir = out_dir

    @property
    def recorder(self) -> RunRecorder:
        return self.control.recorder

    def run(self) -> list[StepStats]:
        control = self.control
        idle = 0
        while not control.done:
            moved = control.route(self.engines)
            for engine in self.engines:
                for c in engine.step():
                    control.complete(c)
                    moved = True
                control.engine_intervals(engine.name, engine.drain_intervals())
            if control.ready():
                self._train()
                moved = True
            idle = 0 if moved or not all(e.idle() for e in self.engines) else idle + 1
            if idle > self.config.max_idle_ticks:
                raise RuntimeError("async loop stalled: no allowance, no engine work, no ready batch")
        if self.out_dir is not None:
            self.trainer.save_checkpoint(self.out_dir / "checkpoint.pt")
        self.recorder.flush()
        return control.history

    def _train(self) -> None:
        stats = self.trainer.train_step(self.control.take())
        version = self.trainer.version
        t0 = self.clock()
        weights = self.trainer.weights()
        for engine in self.engines:
            engine.load_weights(weights, version)
        self.control.stepped(stats, self.trainer.last_intervals, (t0, self.clock()), version)
        if self.control.checkpoint_due(version):
            assert self.out_dir is not None
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
    return summarize(history, before, after, task, seconds, out)


def summarize(history: list[StepStats], before: float, after: float, task: AdditionTask, seconds: float,
              out: Path | None) -> RunResult:
    lags: Counter[int] = Counter()
    for s in history:
        lags.update(dict(s.lags))
    return RunResult(
        steps=len(history), rewards=tuple(s.mean_reward for s in history), eval_before=before, eval_after=after,
        uniform_chance=task.uniform_chance, staleness_tokens=tuple(sorted(lags.items())),
        samples=sum(s.samples for s in history), seconds=seconds, out_dir=out,
    )
