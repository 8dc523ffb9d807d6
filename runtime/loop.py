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
from runtime.records import RunRecorder, read_checkpoint
from runtime.task import AdditionTask
from runtime.trainer import StepStats, TrainConfig, Trainer
from traces.errors import SpecError

__all__ = ["AsyncLoop", "LoopConfig", "RunResult", "evaluate", "resume_record", "run_identity", "run_toy",
           "summarize"]


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
    first_step: int = 0  # > 0: resumed from the checkpoint of this step; `rewards` etc. cover this process
    version: int = 0  # the trainer's final policy version
    optimizer_steps: int = 0  # Adam's step counter at the end (a resume that lost the optimizer restarts it)
    trained_sids: tuple[int, ...] = ()  # sample ids trained by this process, in order
    requeued_sids: tuple[int, ...] = ()  # samples re-generated because their engine died
    duplicates: int = 0  # completions dropped as already in (0 unless an engine was wrongly declared dead)
    engine_restarts: int = 0
    # each trainer rank at the end (Ray runs): rank, pid, node, version, steps it trained, its weights' sha256
    trainer_ranks: tuple[dict[str, Any], ...] = ()

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
                 progress: Callable[[dict[str, Any]], None] | None = None,
                 identity: dict[str, Any] | None = None) -> None:
        self.engines, self.trainer, self.config = engines, trainer, config
        self.control = Controller(task, tokenizer, config, seed, out_dir, clock, progress, identity)
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
        if control.final_checkpoint_due():
            control.checkpoint(self.trainer.save_checkpoint)
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
            self.control.checkpoint(self.trainer.save_checkpoint)


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


def run_identity(task: AdditionTask, engines: int, staleness: int, seed: int, prompts_per_step: int,
                 group_size: int, hidden: int, layers: int, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a checkpoint must match to be resumed: the task, the plan's shape, the model and the seed
    (the steps may grow: a resumed run can be extended; the LR schedule stays the checkpoint's)."""
    return {"task": f"addition(max_operand={task.max_operand})", "engines": engines, "staleness": staleness,
            "seed": seed, "prompts_per_step": prompts_per_step, "group_size": group_size,
            "model": f"tiny-llama(hidden={hidden}, layers={layers})", **(extra or {})}


def resume_record(out: Path | None, resume: bool, identity: dict[str, Any], steps: int) -> dict[str, Any] | None:
    """The checkpoint to continue (SpecError: none, another run's, or already at `steps`), or None."""
    if not resume:
        return None
    if out is None:
        raise SpecError("resuming needs the run folder (out_dir)")
    record = read_checkpoint(out, identity)
    if int(record["version"]) >= steps:
        raise SpecError(f"{out}: the checkpoint is at step {record['version']} already; ask for more than "
                        f"{record['version']} steps to continue it")
    return record


def run_toy(steps: int, engines: int = 2, staleness: int = 2, seed: int = 0, out_dir: str | Path | None = None,
            prompts_per_step: int = 16, group_size: int = 16, train: TrainConfig | None = None,
            interruptible: bool = True, max_batch: int = 256, task: AdditionTask | None = None, hidden: int = 64,
            layers: int = 2, progress: Callable[[dict[str, Any]], None] | None = None,
            checkpoint_every: int = 0, resume: bool = False, identity: dict[str, Any] | None = None) -> RunResult:
    """Train the tiny Llama on digit addition with async GRPO: one trainer, `engines` torch engines.

    Defaults are the measured ones that learn on two CPU cores in well under a minute: operands 0..4
    (9 answers, chance 1/9; with 0..9 and 19 answers the reward still crawls at ~0.1 after 200 steps:
    RL from a random model gets ~1/19 of a label per sample, too little information for the budget),
    16 prompts x 16 samples per step (bigger groups find a rewarded answer more often), Adam at 1e-3
    (2e-3 learns faster, then collapses) decaying linearly to 1e-4 by the last step (at a constant
    rate the policy keeps flipping answers late in the run), and a small entropy bonus.

    `resume`: continue the run in `out_dir` from its last checkpoint (runtime.records).
    """
    toy = toy_setup(steps, engines, staleness, seed, out_dir, prompts_per_step, group_size, train, task, hidden,
                    layers, resume, identity)
    out, task, tokenizer, ident, record, train, model, before = (
        toy.out, toy.task, toy.tokenizer, toy.identity, toy.record, toy.train, toy.model, toy.before)
    clock = time.time  # wall clock, not perf_counter: a resumed run's records continue another process's
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        trainer = Trainer(model, tokenizer.pad_id, train, seed=seed, clock=clock)
        if record is not None:
            assert out is not None
            trainer.load_checkpoint(out / record["trainer"])
        pool: list[RolloutEngine] = [  # a resumed run's engines start from the checkpoint's weights
            TorchEngine(trainer.model, tokenizer.eos_id, tokenizer.pad_id, name=f"engine{i}", max_batch=max_batch,
                        seed=seed * 1000 + i + 1, interruptible=interruptible, version=trainer.version, clock=clock)
            for i in range(engines)
        ]
        loop = AsyncLoop(task, tokenizer, pool, trainer,
                         LoopConfig(steps, prompts_per_step, group_size, staleness, checkpoint_every), seed=seed,
                         out_dir=out, clock=clock, progress=progress, identity=ident)
        if record is not None:
            assert out is not None
            loop.control.restore(record["controller"], RunRecorder.resume(out, record["records"]))
        t0 = clock()
        loop.run()
    seconds = clock() - t0
    after = evaluate(trainer.model, task, tokenizer)
    return summarize(loop.control, before, after, task, seconds, out, trainer.version, trainer.optimizer_steps())


@dataclass(frozen=True)
class ToySetup:
    """What a toy run (run_toy, runtime.ray_loop.run_toy_ray) starts from."""

    out: Path | None
    task: AdditionTask
    tokenizer: CharTokenizer
    identity: dict[str, Any]
    record: dict[str, Any] | None  # the checkpoint record it resumes from, if any
    train: TrainConfig
    model: PreTrainedModel  # the initial model (a resumed trainer then loads its checkpoint)
    before: float  # its reward before training


def toy_setup(steps: int, engines: int, staleness: int, seed: int, out_dir: str | Path | None,
              prompts_per_step: int, group_size: int, train: TrainConfig | None, task: AdditionTask | None,
              hidden: int, layers: int, resume: bool, identity: dict[str, Any] | None) -> ToySetup:
    """The task, the run's identity and resume record, the train config and the initial model (saved
    as the HF folder a vLLM engine would load, on a fresh run with an out folder), and its reward."""
    out = Path(out_dir) if out_dir is not None else None
    task, tokenizer = task or AdditionTask(max_operand=4), CharTokenizer()
    ident = run_identity(task, engines, staleness, seed, prompts_per_step, group_size, hidden, layers, identity)
    record = resume_record(out, resume, ident, steps)
    train = train or TrainConfig(entropy_coef=0.01, decay_steps=steps)  # a resumed trainer takes the checkpoint's
    model = build_model(tiny_llama_config(tokenizer, hidden=hidden, layers=layers, intermediate=4 * hidden), seed=seed)
    if out is not None and record is None:
        save_model(model, tokenizer, out / "initial_model")
    return ToySetup(out, task, tokenizer, ident, record, train, model, evaluate(model, task, tokenizer))


def summarize(control: Controller, before: float, after: float, task: AdditionTask, seconds: float,
              out: Path | None, version: int, optimizer_steps: int, engine_restarts: int = 0) -> RunResult:
    history = control.history
    lags: Counter[int] = Counter()
    for s in history:
        lags.update(dict(s.lags))
    return RunResult(
        steps=control.first_step + len(history), rewards=tuple(s.mean_reward for s in history), eval_before=before,
        eval_after=after, uniform_chance=task.uniform_chance, staleness_tokens=tuple(sorted(lags.items())),
        samples=sum(s.samples for s in history), seconds=seconds, out_dir=out, first_step=control.first_step,
        version=version, optimizer_steps=optimizer_steps, trained_sids=tuple(control.trained_sids),
        requeued_sids=tuple(control.requeued_sids), duplicates=control.duplicates, engine_restarts=engine_restarts,
    )
