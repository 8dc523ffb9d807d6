"""What a run starts from, whoever builds it (runtime.task_factory: the toy task, or a Hugging Face model
on a data set).

Both loops take one (runtime.loop in one process, runtime.ray_run on Ray), so a new entry point
only builds a `RunSetup` and a `LoopConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel

from runtime.contracts import Task, Tokenizer
from runtime.trainer import TrainConfig


@dataclass(frozen=True)
class RunSetup:
    out: Path | None  # the run folder: records, checkpoints, the initial model
    task: Task
    tokenizer: Tokenizer
    identity: dict[str, Any]  # what a checkpoint must match to be resumed by this run (runtime.records)
    record: dict[str, Any] | None  # the checkpoint record it resumes from, if any
    train: TrainConfig
    model: PreTrainedModel  # the initial model (a resumed trainer then loads its checkpoint)
    before: float  # its reward before training (runtime.evaluation)
    # the Hugging Face folder holding the initial weights, for engines that load a folder (vLLM): the
    # toy's saved copy (a fresh run with an out folder) or the --model folder itself; None: none on disk
    model_dir: Path | None = None
