"""What a run starts from, whoever builds it: the toy task (runtime.toy) today, a real model and data set later.

Both loops take one (runtime.loop in one process, runtime.ray_run on Ray), so a new entry point
only builds a `RunSetup` and a `LoopConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel

from runtime.model import CharTokenizer
from runtime.task import AdditionTask
from runtime.trainer import TrainConfig


@dataclass(frozen=True)
class RunSetup:
    out: Path | None  # the run folder: records, checkpoints, the initial model
    task: AdditionTask
    tokenizer: CharTokenizer
    identity: dict[str, Any]  # what a checkpoint must match to be resumed by this run (runtime.records)
    record: dict[str, Any] | None  # the checkpoint record it resumes from, if any
    train: TrainConfig
    model: PreTrainedModel  # the initial model (a resumed trainer then loads its checkpoint)
    before: float  # its reward before training (runtime.evaluation)
