"""A tiny Qwen2 (or Llama) with a real subword tokenizer, saved as a Hugging Face folder: the CPU test model.

No hub download exists on the test machines, so the folder is made here: a byte-level BPE tokenizer
(digits split one per token, as Qwen2's and Llama 3's are) trained with the `tokenizers` library on
the shipped corpus (runtime/arith_data.py), a ChatML chat template (Qwen2's format), and a model of
random weights from a config. `AutoTokenizer` / `AutoModelForCausalLM` (and vLLM) load the folder as
they would a downloaded checkpoint; `rlfleet run --model DIR` trains it.

The vocabulary is the corpus's own bytes plus merges (~100 tokens), not all 256 bytes: a random
model samples its vocabulary near-uniformly, and with 256+ tokens a digit is so rare that GRPO from
random weights almost never sees a reward (text outside the corpus's characters cannot be encoded).
Heads of 32 dimensions: the smallest vLLM's CPU attention kernels take.

Families: qwen2 and llama (dense), qwen3_moe and mixtral (mixture of experts, runtime.tiny_moe: 4
experts of 64, 2 per token). `tools`: the tokenizer also learns the calculator tool's markers
(runtime.calc_data's tool corpus; each marker one added token, as Qwen's <tool_call> is), for
multi-turn runs on runtime/data/calc.jsonl; the context is then 512 positions (an episode holds
several turns).

`python -m runtime.tiny_hf DIR [--family llama|qwen3_moe|mixtral] [--tools]` writes one;
`tiny_model(cache)` builds it once into a cache folder (what tests call).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from transformers import LlamaConfig, PretrainedConfig, PreTrainedTokenizerFast, Qwen2Config

from runtime.arith_data import CORPUS_FILE
from runtime.calc_data import tool_corpus
from runtime.calculator_tool import CALL_CLOSE, CALL_OPEN, RESULT_CLOSE, RESULT_OPEN
from runtime.tiny_moe import MOE_FAMILIES, moe_config
from traces.moe import MoeSpec

FAMILIES = ("qwen2", "llama", *MOE_FAMILIES)
TOOL_TOKENS = (CALL_OPEN, CALL_CLOSE, RESULT_OPEN, RESULT_CLOSE)  # one token each in a --tools tokenizer
TOOL_POSITIONS = 512  # a --tools model's context: prompt, several turns and their tool results
IM_START, IM_END, END_OF_TEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
# Qwen2's ChatML turns, without its default system message (a tiny model's context is short)
CHAT_TEMPLATE = (
    "{% for message in messages %}" + IM_START + "{{ message['role'] }}\n{{ message['content'] }}" + IM_END
    + "\n{% endfor %}{% if add_generation_prompt %}" + IM_START + "assistant\n{% endif %}"
)


@dataclass(frozen=True)
class TinySpec:
    family: str = "qwen2"  # qwen2 | llama | qwen3_moe | mixtral
    vocab_size: int = 112  # the target for BPE; a corpus too small for it gives fewer merges
    hidden: int = 64
    layers: int = 2
    heads: int = 2
    kv_heads: int = 1
    intermediate: int = 256
    max_positions: int = 128
    seed: int = 0
    experts: int = 4  # the MoE families' routed experts, per layer
    experts_per_token: int = 2
    expert_intermediate: int = 64
    tools: bool = False  # the tokenizer learns the calculator's markers too (runtime.calc_data)

    def corpus(self) -> list[str]:
        lines = CORPUS_FILE.read_text(encoding="utf-8").splitlines()
        return [*lines, *tool_corpus()] if self.tools else lines


def train_tokenizer(corpus: list[str], vocab_size: int, added: tuple[str, ...] = ()) -> PreTrainedTokenizerFast:
    """Byte-level BPE on the corpus (each line also seen inside a chat turn, so the template's text has merges);
    `added`: whole-token strings (not special: decoding keeps them), as Qwen's tokenizers add <tool_call>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[END_OF_TEXT, IM_START, IM_END],
                                  show_progress=False)
    turns = [f"user\n{line}\nassistant\n" for line in corpus]
    backend.train_from_iterator([*corpus, *turns], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=IM_END, pad_token=END_OF_TEXT,
                                   additional_special_tokens=[IM_START])
    fast.chat_template = CHAT_TEMPLATE
    if added:
        fast.add_tokens(list(added))
    return fast


def tiny_config(spec: TinySpec, tokenizer: PreTrainedTokenizerFast) -> PretrainedConfig:
    common = {"vocab_size": len(tokenizer), "hidden_size": spec.hidden, "intermediate_size": spec.intermediate,
              "num_hidden_layers": spec.layers, "num_attention_heads": spec.heads,
              "num_key_value_heads": spec.kv_heads, "max_position_embeddings": spec.max_positions,
              "tie_word_embeddings": True, "eos_token_id": tokenizer.eos_token_id,
              "pad_token_id": tokenizer.pad_token_id, "bos_token_id": None}
    if spec.family == "qwen2":
        return Qwen2Config(**common)
    if spec.family == "llama":
        return LlamaConfig(**common)
    if spec.family in MOE_FAMILIES:
        moe = MoeSpec(experts=spec.experts, experts_per_token=spec.experts_per_token,
                      expert_intermediate=spec.expert_intermediate)
        return moe_config(spec.family, moe, common)
    raise ValueError(f"family {spec.family!r}: the tiny model is one of {', '.join(FAMILIES)}")


def write_tiny_model(folder: str | os.PathLike[str], spec: TinySpec | None = None) -> Path:
    """Tokenizer, config and random weights (seeded) into `folder`, as `save_pretrained` writes them."""
    from transformers import AutoModelForCausalLM

    spec = spec or TinySpec()
    path = Path(folder)
    tokenizer = train_tokenizer(spec.corpus(), spec.vocab_size, TOOL_TOKENS if spec.tools else ())
    config = tiny_config(spec, tokenizer)
    with torch.random.fork_rng(devices=[]):  # leave the caller's global stream alone
        torch.manual_seed(spec.seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    return path


def tiny_model(cache: str | os.PathLike[str], spec: TinySpec | None = None) -> Path:
    """The tiny model's folder under `cache`, built on first use (keyed by the spec and the corpus)."""
    spec = spec or TinySpec()
    key = hashlib.sha256(json.dumps(asdict(spec), sort_keys=True).encode() + "\n".join(spec.corpus()).encode())
    folder = Path(cache) / f"tiny-{spec.family}-{key.hexdigest()[:12]}"
    if (folder / "config.json").exists():
        return folder
    Path(cache).mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".tiny-", dir=cache))
    try:
        write_tiny_model(scratch, spec)
        os.replace(scratch, folder)  # whole or absent: a crashed build leaves no half folder behind
    except OSError:
        if not (folder / "config.json").exists():  # not another process that won the race
            raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return folder


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m runtime.tiny_hf", description=__doc__.splitlines()[0])
    parser.add_argument("folder", help="where to write the Hugging Face folder")
    parser.add_argument("--family", choices=FAMILIES, default="qwen2")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tools", action="store_true", help="a tokenizer that writes the calculator's markers, "
                        f"and {TOOL_POSITIONS} positions (multi-turn runs on runtime/data/calc.jsonl)")
    args = parser.parse_args(argv)
    spec = TinySpec(family=args.family, seed=args.seed, tools=args.tools)
    if args.tools:
        spec = replace(spec, max_positions=TOOL_POSITIONS)
    path = write_tiny_model(args.folder, spec)
    print(f"wrote a tiny {args.family} to {path}")


if __name__ == "__main__":
    main()
