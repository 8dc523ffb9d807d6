"""What a run gives back: how its loop ended (`Finished`) and the summary of the run (`RunResult`)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel

from runtime.controller import Controller
from runtime.evaluation import evaluate
from runtime.run_setup import RunSetup


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
    placement: dict[str, Any] | None = None  # who ran where (runtime.placement_record; Ray runs)
    # each live engine at the end (Ray runs): name, engine class, tp, sync ranks, pid, node, version, completed
    engines: tuple[dict[str, Any], ...] = ()
    tool_calls: int = 0  # tool calls recorded (agentic runs: runtime.episodes)

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

    def reward_curve(self, parts: int = 10) -> list[float]:
        """The mean training reward of each of `parts` equal spans of the steps (a learning curve)."""
        span = max(1, len(self.rewards) // parts)
        chunks = [self.rewards[i:i + span] for i in range(0, len(self.rewards), span)]
        return [sum(chunk) / len(chunk) for chunk in chunks]


@dataclass(frozen=True)
class Finished:
    """How a loop ended: its controller, the trained model, and what the trainer reported at the end."""

    control: Controller
    model: PreTrainedModel  # the trainer's final weights
    seconds: float  # the loop's wall time, without start-up and evaluation
    version: int
    optimizer_steps: int
    engine_restarts: int = 0
    trainer_ranks: tuple[dict[str, Any], ...] = ()  # every rank's `describe()` (Ray runs)
    placement: dict[str, Any] | None = None  # who ran where (runtime.placement_record; Ray runs)
    engines: tuple[dict[str, Any], ...] = ()  # every live engine actor's `describe()` (Ray runs)


def summarize(setup: RunSetup, finished: Finished) -> RunResult:
    """The run's result, with the trained model evaluated as the untrained one was."""
    control, task = finished.control, setup.task
    after = evaluate(finished.model, task, setup.tokenizer)
    history = control.history
    lags: Counter[int] = Counter()
    for s in history:
        lags.update(dict(s.lags))
    return RunResult(
        steps=control.first_step + len(history), rewards=tuple(s.mean_reward for s in history),
        eval_before=setup.before, eval_after=after, uniform_chance=task.uniform_chance,
        staleness_tokens=tuple(sorted(lags.items())), samples=sum(s.samples for s in history),
        seconds=finished.seconds, out_dir=setup.out, first_step=control.first_step, version=finished.version,
        optimizer_steps=finished.optimizer_steps, trained_sids=tuple(control.trained_sids),
        requeued_sids=tuple(control.requeued_sids), duplicates=control.duplicates,
        engine_restarts=finished.engine_restarts, trainer_ranks=finished.trainer_ranks,
        placement=finished.placement, engines=finished.engines, tool_calls=len(control.recorder.tool_calls),
    )
