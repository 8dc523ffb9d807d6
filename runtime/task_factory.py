"""What a run trains, and the `RunSetup` it starts from: the toy, or a Hugging Face model on a data set.

`TaskSource` is what the command line names: nothing (the toy: digit addition, the character
tokenizer, a tiny Llama built in code), or `--model DIR` with `--dataset FILE` (any local causal LM
with its tokenizer, runtime.hf_model; a JSONL or parquet data set, runtime.dataset; a reward,
runtime.rewards). `build_setup` turns either into the `RunSetup` both loops run (runtime.loop in
one process, runtime.ray_run on Ray), with the run's identity, which a resumed run must match.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.data_task import DatasetTask
from runtime.dataset import load_records
from runtime.evaluation import evaluate
from runtime.hf_model import load_causal_lm, load_tokenizer
from runtime.model import CharTokenizer, build_model, save_model, toy_config
from runtime.records import resume_record
from runtime.rewards import load_reward
from runtime.run_setup import RunSetup
from runtime.task import AdditionTask
from runtime.trainer import TrainConfig
from traces.errors import SpecError
from traces.moe import MoeSpec

TOY_LR, TOY_ENTROPY = 1e-3, 0.01  # measured on the toy task (runtime.toy.run_toy says why)
HF_LR = 1e-6  # a pretrained LLM's: verl's GRPO examples train 7B models at 1e-6


@dataclass(frozen=True)
class TaskSource:
    model: str | None = None  # a Hugging Face model folder
    dataset: str | None = None  # JSONL or parquet
    prompt_field: str = "prompt"
    answer_field: str = "answer"
    reward: str = "math"  # a built-in name or module:function
    max_new_tokens: int = 256  # the response cap
    eval_prompts: int = 64  # distinct prompts in the evaluation set
    lr: float | None = None  # None: TOY_LR on the toy, HF_LR on a --model (both decay to 1/10 by the last step)

    @property
    def toy(self) -> bool:
        return self.model is None and self.dataset is None

    def check(self) -> None:
        if self.model is None and self.dataset is not None:
            raise SpecError("--dataset needs --model DIR (a Hugging Face model folder with its tokenizer); "
                            "python -m runtime.tiny_hf DIR writes a tiny one")
        if self.model is not None and self.dataset is None:
            raise SpecError("--model needs --dataset FILE (JSONL or parquet with a prompt and an answer field); "
                            "runtime/data/arith_word.jsonl is a small one")
        if self.max_new_tokens < 1:
            raise SpecError(f"--max-new-tokens {self.max_new_tokens}: a response needs at least one token")
        if self.eval_prompts < 1:
            raise SpecError(f"eval_prompts {self.eval_prompts}: the evaluation needs at least one prompt")


@dataclass(frozen=True)
class SetupShape:
    """What of the run's shape a setup needs: steps, engines, the bound, the batch, the seed, the folder."""

    steps: int
    engines: int
    staleness: int
    seed: int
    prompts_per_step: int
    group_size: int
    out: Path | None
    resume: bool = False

    def identity(self, task: str, model: str, extra: dict[str, Any] | None) -> dict[str, Any]:
        """What a checkpoint must match to be resumed: the task, the plan's shape, the model and the seed
        (the steps may grow: a resumed run can be extended; the LR schedule stays the checkpoint's)."""
        return {"task": task, "engines": self.engines, "staleness": self.staleness, "seed": self.seed,
                "prompts_per_step": self.prompts_per_step, "group_size": self.group_size, "model": model,
                **(extra or {})}


def toy_setup(shape: SetupShape, train: TrainConfig | None, task: AdditionTask | None, hidden: int, layers: int,
              identity: dict[str, Any] | None, lr: float | None = None, heads: int = 4, kv_heads: int = 2,
              moe: MoeSpec | None = None) -> RunSetup:
    """The addition task, the character tokenizer and a tiny Llama (with `moe`: a tiny Qwen3-MoE) from a
    config (saved as the HF folder a vLLM engine would load, on a fresh run with an out folder), and its
    reward before training."""
    task, tokenizer = task or AdditionTask(max_operand=4), CharTokenizer()
    experts = "" if moe is None else (f", experts={moe.experts}, top_k={moe.experts_per_token}, "
                                      f"expert_intermediate={moe.expert_intermediate}")
    ident = shape.identity(f"addition(max_operand={task.max_operand})",
                           ("tiny-llama" if moe is None else "tiny-qwen3-moe") + f"(hidden={hidden}, layers={layers}"
                           + (f", heads={heads}, kv_heads={kv_heads}" if (heads, kv_heads) != (4, 2) else "")
                           + experts + ")", identity)
    record = resume_record(shape.out, shape.resume, ident, shape.steps)
    # a resumed trainer takes the checkpoint's config instead
    train = train or TrainConfig(lr=lr or TOY_LR, decay_steps=shape.steps, entropy_coef=TOY_ENTROPY)
    model = build_model(toy_config(tokenizer, layers, hidden, heads, kv_heads, moe), seed=shape.seed)
    model_dir = None
    if shape.out is not None and record is None:
        model_dir = save_model(model, tokenizer, shape.out / "initial_model")
    return RunSetup(shape.out, task, tokenizer, ident, record, train, model, evaluate(model, task, tokenizer),
                    model_dir)


def data_setup(source: TaskSource, shape: SetupShape, train: TrainConfig | None,
               identity: dict[str, Any] | None) -> RunSetup:
    """The folder's model and tokenizer on the data set's prompts, with the reward named; every input is
    checked (fields, reward, model type, context length) before the model's weights are read."""
    assert source.model is not None and source.dataset is not None
    tokenizer = load_tokenizer(source.model)
    records = load_records(source.dataset, source.prompt_field, source.answer_field)
    task = DatasetTask.build(records, tokenizer.render, load_reward(source.reward), source.reward,
                             source.max_new_tokens, source.eval_prompts)
    longest = max(len(tokenizer.encode(p)) for p in set(task.prompts))  # also: every prompt encodes
    folder = Path(source.model)
    config_text = (folder / "config.json").read_bytes()
    ident = shape.identity(
        f"dataset({Path(source.dataset).name}, sha256={_sha(Path(source.dataset).read_bytes())}, "
        f"prompt={source.prompt_field}, answer={source.answer_field}, reward={source.reward}, "
        f"max_new_tokens={source.max_new_tokens})",
        f"hf({folder.resolve().name}, config sha256={_sha(config_text)})", identity)
    context = json.loads(config_text).get("max_position_embeddings")  # check_folder read it as an object
    if isinstance(context, int) and longest + source.max_new_tokens > context:
        raise SpecError(f"--model {folder}: the longest prompt ({longest} tokens) plus --max-new-tokens "
                        f"{source.max_new_tokens} exceeds its context of {context}; lower --max-new-tokens")
    record = resume_record(shape.out, shape.resume, ident, shape.steps)
    model = load_causal_lm(folder)
    train = train or TrainConfig(lr=source.lr or HF_LR, decay_steps=shape.steps)
    # the engines load the folder itself: no copy of a large checkpoint in every run folder
    return RunSetup(shape.out, task, tokenizer, ident, record, train, model, evaluate(model, task, tokenizer),
                    folder)


def build_setup(source: TaskSource | None, shape: SetupShape, train: TrainConfig | None = None,
                identity: dict[str, Any] | None = None, task: AdditionTask | None = None, hidden: int = 64,
                layers: int = 2, heads: int = 4, kv_heads: int = 2, moe: MoeSpec | None = None) -> RunSetup:
    """The run's setup from what it trains (`task` and the model's shape: the toy's, ignored otherwise)."""
    source = source or TaskSource()
    source.check()
    if source.toy:
        return toy_setup(shape, train, task, hidden, layers, identity, source.lr, heads, kv_heads, moe)
    return data_setup(source, shape, train, identity)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]
