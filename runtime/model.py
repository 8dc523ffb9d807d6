"""A tiny Llama (or Qwen3-MoE) with random weights and a character tokenizer, saved in Hugging Face format.

No hub download exists on the test machines, so the model is built from a config and the tokenizer
from a fixed alphabet. Both are written with `save_pretrained`, so transformers' `Auto*` classes (and
vLLM, runtime.vllm_engine) load the folder exactly as they would load a real checkpoint.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import LlamaConfig, PretrainedConfig, PreTrainedModel

from runtime.contracts import Tokenizer
from runtime.tiny_moe import moe_config
from traces.moe import MoeSpec

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>")
ALPHABET = "0123456789+-*="


@dataclass(frozen=True)
class CharTokenizer:
    """One id per character; ids 0, 1, 2 are pad, bos and eos."""

    alphabet: str = ALPHABET

    @property
    def pad_id(self) -> int:
        return 0

    @property
    def bos_id(self) -> int:
        return 1

    @property
    def eos_id(self) -> int:
        return 2

    @property
    def vocab_size(self) -> int:
        return len(SPECIAL_TOKENS) + len(self.alphabet)

    def encode(self, text: str, bos: bool = True) -> list[int]:
        try:
            ids = [len(SPECIAL_TOKENS) + self.alphabet.index(ch) for ch in text]
        except ValueError:
            raise ValueError(f"text {text!r} has characters outside the alphabet {self.alphabet!r}") from None
        return [self.bos_id, *ids] if bos else ids

    def decode(self, ids: list[int] | tuple[int, ...]) -> str:
        """Characters up to the first eos; pad and bos are dropped."""
        out = []
        for i in ids:
            if i == self.eos_id:
                break
            if i >= len(SPECIAL_TOKENS):
                out.append(self.alphabet[i - len(SPECIAL_TOKENS)])
        return "".join(out)

    def save(self, folder: str | os.PathLike[str]) -> None:
        """Write `tokenizer.json` + config so `AutoTokenizer.from_pretrained(folder)` gives the same ids."""
        from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
        from transformers import PreTrainedTokenizerFast

        vocab = {tok: i for i, tok in enumerate([*SPECIAL_TOKENS, *self.alphabet])}
        backend = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
        backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")  # one token per character
        backend.decoder = decoders.Fuse()
        fast = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", bos_token="<bos>",
                                       eos_token="<eos>")
        fast.save_pretrained(str(folder))


def tiny_llama_config(tokenizer: CharTokenizer, layers: int = 2, hidden: int = 64, heads: int = 4,
                      kv_heads: int = 2, intermediate: int = 256, max_positions: int = 64) -> LlamaConfig:
    """A Llama small enough to train with RL on two CPU cores in a minute; GQA kept so the shapes are real."""
    return LlamaConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=hidden, intermediate_size=intermediate,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions, tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_id, bos_token_id=tokenizer.bos_id, eos_token_id=tokenizer.eos_id,
    )


def toy_config(tokenizer: CharTokenizer, layers: int = 2, hidden: int = 64, heads: int = 4, kv_heads: int = 2,
               moe: MoeSpec | None = None) -> PretrainedConfig:
    """The toy's model: the tiny Llama (MLP 4x hidden), or with `moe` the same attention over routed MLPs
    (transformers' Qwen3-MoE, runtime.tiny_moe)."""
    dense = tiny_llama_config(tokenizer, layers, hidden, heads, kv_heads, intermediate=4 * hidden)
    if moe is None:
        return dense
    keys = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "max_position_embeddings", "tie_word_embeddings", "pad_token_id",
            "bos_token_id", "eos_token_id")
    return moe_config("qwen3_moe", moe, {k: getattr(dense, k) for k in keys})


def build_model(config: PretrainedConfig, seed: int = 0) -> PreTrainedModel:
    """Random weights, reproducible from the seed, float32 (CPU kernels are exact enough for 1e-4 checks)."""
    from transformers import AutoModelForCausalLM

    with torch.random.fork_rng(devices=[]):  # leave the caller's global stream alone
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model.float().eval()


def save_model(model: PreTrainedModel, tokenizer: Tokenizer, folder: str | os.PathLike[str]) -> Path:
    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(path))
    tokenizer.save(path)
    return path


def load_model(folder: str | os.PathLike[str]) -> PreTrainedModel:
    """Any causal LM's folder (the toy's, or a --model folder a Ray actor is given by path), float32."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()


def model_of(model: PreTrainedModel | str) -> PreTrainedModel:
    """The model itself, or the one in the Hugging Face folder named (what a Ray actor may be given instead)."""
    return load_model(model) if isinstance(model, str) else model
