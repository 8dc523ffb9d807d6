"""The RL job: model, algorithm, batch shape, length distributions, mode."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from traces.agentic import Agentic
from traces.errors import SpecError
from traces.hf_config import model_from_hf_entry
from traces.io import data_files, data_text, load_yaml, load_yaml_text, read_user_text, validate
from traces.lengths import MAX_TOKENS, LengthDist
from traces.lora import check_lora
from traces.models import ModelSpec, resolve_model

_FROZEN = ConfigDict(frozen=True, extra="forbid")
# How a trainer runs the model (traces/costmodel/elementwise.py): the field's values, for the CLI too
TrainerKernels = Literal["fused", "eager"]
TRAINER_KERNELS: tuple[str, ...] = get_args(TrainerKernels)


class DynamicSampling(BaseModel):
    """DAPO's dynamic sampling (Yu et al. 2025, arXiv 2503.14476, sec. 3.2): groups whose rewards are
    all equal (every answer right, or every one wrong) carry no advantage and are dropped; generation
    goes on until the batch is full of groups that pass (verl: algorithm.filter_groups)."""

    model_config = _FROZEN

    pass_rate: float = Field(gt=0, le=1, description="share of prompt groups with mixed rewards, kept")
    oversample: float = Field(
        default=1.0, ge=1, le=100, description="generation runs ahead by this factor of what the batch still "
        "lacks (verl's gen_batch_size / train_batch_size); passing groups beyond the batch are dropped")

    @property
    def generated_per_trained(self) -> float:
        """Samples generated per sample trained, in expectation: 1 / pass_rate while generation replaces
        drops as it learns of them, and at least `oversample` when it runs that far ahead."""
        return max(1.0 / self.pass_rate, self.oversample)


class Workload(BaseModel):
    """One RL post-training job."""

    model_config = _FROZEN

    name: str = Field(default="workload", max_length=128)
    model: ModelSpec
    algorithm: Literal["grpo", "ppo"] = "grpo"
    prompts_per_step: int = Field(ge=1, le=1_000_000)
    group_size: int = Field(default=8, ge=1, le=4096, description="responses per prompt (GRPO n)")
    prompt_len: LengthDist
    response_len: LengthDist
    mode: Literal["async", "sync", "colocated"] = "async"
    staleness: int | float = Field(
        default=0, ge=0, le=1000, description="max policy-version lag (eta); a fraction is part of a batch run "
        "ahead per version (verl's staleness_threshold): at most floor((eta + v + 1) B) samples admitted by version v")
    interruptible: bool = True
    reward_seconds: float = Field(default=0.0, ge=0, le=3600, description="reward latency per sample")
    ppo_minibatches: int = Field(default=1, ge=1, le=1024)
    stream_chunks: int = Field(
        default=1, ge=1, le=1024, description="streaming training: a step's batch is trained in this many chunks, "
        "each as soon as it is complete (verl fully_async's local steps); divides ppo_minibatches and prompts_per_step")
    kl_reference: bool = Field(
        default=False, description="KL penalty to a frozen reference policy: one more forward pass per step")
    dynamic_sampling: DynamicSampling | None = Field(
        default=None, description="DAPO's filter of groups with all-equal rewards; None: every group is trained")
    rollout_logprobs: bool = Field(
        default=False, description="the loss takes the engines' per-token logprobs as the old policy's "
        "(verl's rollout.calculate_log_probs, AReaL's use_decoupled_loss off): no trainer recompute pass")
    agentic: Agentic | None = Field(
        default=None, description="multi-turn episodes with tool calls (traces.agentic); response_len is then "
        "one turn's answer. None: one turn, no tools")
    train_microbatch_tokens: int | None = Field(
        default=None, ge=1, le=100_000_000, description="tokens a trainer GPU packs into one micro-batch "
        "(verl's ppo_max_token_len_per_gpu with use_dynamic_bsz, Relax's --max-tokens-per-gpu, TRL's token_budget); "
        "at least the longest sequence. None: one longest sequence per micro-batch")
    trainer_kernels: TrainerKernels = Field(
        default="fused", description="how the trainer runs the model: 'fused' (Megatron-Core with Transformer "
        "Engine) or 'eager' (Hugging Face modules op by op, as verl's FSDP workers and TRL do: the traffic of the "
        "ops between GEMMs adds, traces/costmodel/elementwise.py)")
    lora_rank: int = Field(
        default=0, ge=0, le=65536, description="LoRA: the trainer trains a rank-r adapter on every linear layer "
        "and freezes the base (traces.lora; engines load the adapter at sync). 0: full fine-tuning")

    @field_validator("model", mode="before")
    @classmethod
    def _model(cls, value: Any) -> Any:
        if isinstance(value, str):
            return resolve_model(value)
        if isinstance(value, dict) and "hf_config" in value:
            return model_from_hf_entry(value)
        return value

    @field_validator("algorithm", "mode", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _check(self) -> Workload:
        if self.mode != "async" and self.staleness > 0:
            raise ValueError(
                f"staleness {self.staleness} contradicts mode '{self.mode}' (on-policy): "
                "set staleness: 0 or mode: async"
            )
        if self.ppo_minibatches > self.samples_per_step:
            raise ValueError(
                f"ppo_minibatches ({self.ppo_minibatches}) exceeds samples per step "
                f"({self.samples_per_step}); lower it"
            )
        if self.stream_chunks > 1:
            if self.mode == "colocated":
                raise ValueError(f"stream_chunks {self.stream_chunks} needs GPUs that train while others generate: "
                                 "set stream_chunks: 1 or mode: async/sync")
            if self.ppo_minibatches % self.stream_chunks or self.prompts_per_step % self.stream_chunks:
                raise ValueError(f"stream_chunks ({self.stream_chunks}) must divide ppo_minibatches "
                                 f"({self.ppo_minibatches}) and prompts_per_step ({self.prompts_per_step}): each chunk "
                                 "is whole minibatches of whole groups")
        if self.train_microbatch_tokens is not None and self.train_microbatch_tokens < self.max_seq_len:
            raise ValueError(f"train_microbatch_tokens ({self.train_microbatch_tokens}) is below the longest sequence "
                             f"({self.max_seq_len}, prompt_len.max + response_len.max): a sequence is not split "
                             "across micro-batches; raise it or leave it unset")
        if self.lora_rank:
            try:
                check_lora(self.model, self.lora_rank)
            except SpecError as err:
                raise ValueError(str(err)) from None
        longest = "prompt_len.max + response_len.max" if self.agentic is None else (
            "prompt_len.max + agentic.turns.max x response_len.max + tool calls x agentic.tool_tokens.max")
        if self.max_seq_len > MAX_TOKENS:
            raise ValueError(f"{longest} ({self.max_seq_len}) exceeds {MAX_TOKENS} tokens")
        if self.model.max_context is not None and self.max_seq_len > self.model.max_context:
            raise ValueError(
                f"{longest} ({self.max_seq_len}) exceeds the {self.model.max_context}-token "
                f"context of {self.model.name}; lower the caps"
            )
        return self

    @property
    def samples_per_step(self) -> int:
        return self.prompts_per_step * self.group_size

    def interrupts(self, mode: str) -> bool:
        """Whether a weight load interrupts running samples: only in async mode (sync and colocated
        runs load weights between steps, with nothing in flight), and only if the job allows it."""
        return self.interruptible and mode == "async"

    @property
    def generated_per_trained(self) -> float:
        """Samples generated per sample trained (dynamic sampling drops the rest): 1 without it."""
        return 1.0 if self.dynamic_sampling is None else self.dynamic_sampling.generated_per_trained

    @property
    def microbatch_tokens(self) -> int:
        """Tokens per trainer micro-batch: the packing budget, or one longest sequence."""
        return self.max_seq_len if self.train_microbatch_tokens is None else self.train_microbatch_tokens

    @property
    def max_seq_len(self) -> int:
        """The longest trained sequence: a whole episode when the workload is agentic."""
        if self.agentic is not None:
            return self.agentic.max_context(self.prompt_len, self.response_len)
        return self.prompt_len.max + self.response_len.max

    @property
    def mean_tokens_per_sample(self) -> float:
        if self.agentic is not None:
            return self.agentic.expected_tokens(self.prompt_len, self.response_len)
        return self.prompt_len.expected() + self.response_len.expected()

    @property
    def mean_generated_tokens_per_sample(self) -> float:
        """Tokens the engines decode per sample: every turn's answer (tool results are prefilled)."""
        turns = 1.0 if self.agentic is None else self.agentic.turns.expected()
        return turns * self.response_len.expected()


def _inline_files(data: Any, base: Path) -> Any:
    """Replace `file:` in empirical length distributions by the CSV's lengths and counts, and make a
    model's `hf_config:` path relative to the workload file."""
    if not isinstance(data, dict):
        return data
    out = dict(data)
    model = out.get("model")
    if isinstance(model, dict) and isinstance(model.get("hf_config"), str):
        out["model"] = {**model, "hf_config": str(base / model["hf_config"])}
    for key in ("prompt_len", "response_len"):
        dist = out.get(key)
        if isinstance(dist, dict) and "file" in dist:
            dist = dict(dist)
            path = base / str(dist.pop("file"))
            lengths, counts = read_histogram(path)
            out[key] = {**dist, "lengths": lengths, "counts": counts}
    return out


def read_histogram(path: Path) -> tuple[list[int], list[float]]:
    """A length histogram CSV: header `length,count`, one bin per row."""
    import pandas as pd

    if not os.path.lexists(path):
        raise SpecError(f"{path}: histogram file not found; the path is relative to the workload file")
    text = read_user_text(path)
    try:
        frame = pd.read_csv(io.StringIO(text))
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise SpecError(f"{path}: not a CSV histogram ({str(exc).splitlines()[0]})") from None
    missing = {"length", "count"} - set(frame.columns)
    if missing:
        raise SpecError(f"{path}: histogram needs columns length,count; missing {', '.join(sorted(missing))}")
    lengths = pd.to_numeric(frame["length"], errors="coerce").to_numpy(float)
    counts = pd.to_numeric(frame["count"], errors="coerce").to_numpy(float)
    if not np.isfinite(lengths).all() or (lengths != np.round(lengths)).any():
        raise SpecError(f"{path}: column length must hold whole numbers of tokens")
    if np.isnan(counts).any():
        raise SpecError(f"{path}: column count must hold numbers")
    return [int(x) for x in lengths], [float(c) for c in counts]


def workload_from_dict(data: Any, origin: str, base: Path | None = None) -> Workload:
    return validate(Workload, _inline_files(data, base or Path.cwd()), origin)


def load_workload(path: str | os.PathLike[str]) -> Workload:
    p = Path(path)
    return workload_from_dict(load_yaml(p), str(p), p.parent)


def example_workloads() -> list[str]:
    return [name.removesuffix(".yaml") for name in data_files("workloads")]


def example_workload(name: str) -> Workload:
    if name not in example_workloads():
        raise SpecError(f"unknown example workload '{name}'; known: {', '.join(example_workloads())}")
    text = data_text(f"workloads/{name}.yaml")
    return workload_from_dict(load_yaml_text(text, f"{name}.yaml"), f"{name}.yaml")
