"""Any local Hugging Face causal LM and its tokenizer, as a run uses them (`rlfleet run --model DIR`).

`load_hf(folder)` checks the folder before any weight is read: a config.json that transformers
knows, a model type with a causal-LM class (an encoder-decoder or encoder-only folder is refused in
one line), a tokenizer with an eos token. Weights load in float32: the runtime trains on CPU here
(a GPU trainer would load bf16; not run here).

`HfTokenizer` is the runtime's tokenizer interface (runtime.contracts) over it. Prompts are written
with the tokenizer's chat template where it has one (a user turn, then the assistant's turn opened),
and that text is encoded without the tokenizer's own special tokens: the template already holds
whatever bos the model expects (transformers' chat-template docs: apply the template, then encode
with add_special_tokens=False, or bos comes twice). Without a template the prompt is encoded as is,
with the tokenizer's special tokens. One eos id ends a response (the tokenizer's); the pad id is the
tokenizer's, or eos where it has none (pad positions are masked everywhere).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from traces.errors import SpecError


class HfTokenizer:
    def __init__(self, tokenizer: Any) -> None:
        if tokenizer.eos_token_id is None:
            raise SpecError(f"tokenizer of {tokenizer.name_or_path}: no eos token; set eos_token in its "
                            "tokenizer_config.json")
        self._tok = tokenizer
        self.chat = bool(getattr(tokenizer, "chat_template", None))
        self._eos = int(tokenizer.eos_token_id)
        self._pad = int(tokenizer.pad_token_id) if tokenizer.pad_token_id is not None else self._eos

    @property
    def pad_id(self) -> int:
        return self._pad

    @property
    def eos_id(self) -> int:
        return self._eos

    def render(self, prompt: str) -> str:
        """The text a prompt is given to the model as: one user turn in the chat template, if there is one."""
        if not self.chat:
            return prompt
        text = self._tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                             add_generation_prompt=True)
        return str(text)

    def encode(self, text: str) -> list[int]:
        ids = self._tok.encode(text, add_special_tokens=not self.chat)
        if not ids:
            raise SpecError(f"prompt {text[:60]!r} encodes to no tokens with {self._tok.name_or_path}'s tokenizer")
        return list(ids)

    def decode(self, ids: list[int] | tuple[int, ...]) -> str:
        """The response text up to the first eos, special tokens dropped."""
        ids = list(ids)
        if self._eos in ids:
            ids = ids[: ids.index(self._eos)]
        return str(self._tok.decode(ids, skip_special_tokens=True))

    def save(self, folder: str | os.PathLike[str]) -> None:
        self._tok.save_pretrained(str(folder))


def check_folder(folder: str | os.PathLike[str]) -> Path:
    """A model folder transformers can build a causal LM from; SpecError in one line otherwise."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    path = Path(folder)
    config_file = path / "config.json"
    if not path.is_dir():
        raise SpecError(f"--model {path}: not a folder (give a Hugging Face model folder with config.json)")
    if not config_file.is_file():
        raise SpecError(f"--model {path}: no config.json; not a Hugging Face model folder")
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SpecError(f"--model {path}: config.json is not JSON ({exc})") from None
    model_type = config.get("model_type") if isinstance(config, dict) else None
    if not isinstance(model_type, str):
        raise SpecError(f"--model {path}: config.json has no model_type")
    if config.get("is_encoder_decoder") or model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise SpecError(f"--model {path}: model_type {model_type!r} is not a causal LM "
                        "(AutoModelForCausalLM has no class for it); give a decoder-only model")
    return path


def load_tokenizer(folder: str | os.PathLike[str]) -> HfTokenizer:
    from transformers import AutoTokenizer

    path = check_folder(folder)
    try:
        return HfTokenizer(AutoTokenizer.from_pretrained(str(path)))
    except (OSError, ValueError) as exc:  # no tokenizer files, or ones transformers cannot read
        raise SpecError(f"--model {path}: no tokenizer AutoTokenizer can load ({str(exc).splitlines()[0]})") from None


def load_causal_lm(folder: str | os.PathLike[str]) -> PreTrainedModel:
    """The folder's model, float32, in eval mode."""
    from transformers import AutoModelForCausalLM

    path = check_folder(folder)
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    except (OSError, ValueError) as exc:  # no weight files, or shapes that do not match the config
        raise SpecError(f"--model {path}: the weights do not load ({str(exc).splitlines()[0]})") from None
    return model.eval()
