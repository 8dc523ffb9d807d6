"""A Hugging Face ``config.json`` read as a ModelSpec.

A workload's model may name the config file, or give its fields inline::

    model: {hf_config: models/Qwen2.5-7B-Instruct/config.json}     # relative to the workload file
    model: {hf_config: {model_type: llama, hidden_size: 4096, ...}, name: my-llama}

``name`` is optional with a file (default: the file's folder, or its stem when it is not called
config.json, lower-cased) and required inline. Fields read, with transformers' defaults when absent:

- ``model_type``: llama, mistral, qwen2 (q/k/v projections carry a bias) or qwen3 (q/k RMSNorm);
- ``num_hidden_layers``, ``hidden_size``, ``num_attention_heads``, ``intermediate_size``, ``vocab_size``;
- ``num_key_value_heads`` (absent: one per attention head), ``head_dim`` (absent: hidden / heads;
  qwen3: 128), ``attention_bias`` (absent: the family's), ``tie_word_embeddings`` (absent: false),
  ``max_position_embeddings`` (the longest sample a workload may ask for), ``torch_dtype`` or
  ``dtype`` (bfloat16 / float16: 2 bytes per weight, float32: 4; absent: 2).

Every other field is ignored. Mixture-of-experts configs (``num_experts``, ``num_local_experts``,
``n_routed_experts``) are refused: rlfleet models dense transformers only so far. The mapping is
written out here because transformers (which has AutoConfig) is only in the runtime extra.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

from traces.errors import SpecError
from traces.io import load_yaml, validate
from traces.models import ModelSpec

MOE_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts")
DTYPE_BYTES = {"bfloat16": 2.0, "float16": 2.0, "float32": 4.0}
# Per family (transformers' modeling_<type>.py): q/k/v bias by default, q/k norm, head_dim default.
FAMILIES: dict[str, tuple[bool, bool, int | None]] = {
    "llama": (False, False, None),
    "mistral": (False, False, None),
    "qwen2": (True, False, None),  # Qwen2Attention: q/k/v Linear(bias=True), o_proj without
    "qwen3": (False, True, 128),  # Qwen3Config(head_dim=128); q_norm/k_norm per head
}


class HfConfig(BaseModel):
    """The config.json fields rlfleet reads (names and meaning as in transformers)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    model_type: str
    num_hidden_layers: StrictInt = Field(ge=1, le=1000)
    hidden_size: StrictInt = Field(ge=1, le=1_000_000)
    num_attention_heads: StrictInt = Field(ge=1, le=10_000)
    num_key_value_heads: StrictInt | None = Field(default=None, ge=1, le=10_000)
    head_dim: StrictInt | None = Field(default=None, ge=1, le=10_000)
    intermediate_size: StrictInt = Field(ge=1, le=10_000_000)
    vocab_size: StrictInt = Field(ge=1, le=10_000_000)
    max_position_embeddings: StrictInt | None = Field(default=None, ge=1, le=100_000_000)
    tie_word_embeddings: StrictBool = False
    attention_bias: StrictBool | None = None
    torch_dtype: str | None = None
    dtype: str | None = None  # what transformers >= 4.56 writes instead of torch_dtype


def model_from_hf(value: Any, name: str | None, origin: str) -> ModelSpec:
    """A ModelSpec from a config.json mapping; SpecError (one line, naming the field) when it cannot be."""
    if not isinstance(value, dict):
        raise SpecError(f"{origin}: expected the fields of a config.json, got {type(value).__name__}")
    moe = [f for f in MOE_FIELDS if value.get(f)]
    if moe:
        raise SpecError(f"{origin}: a mixture-of-experts config ({moe[0]}); MoE models are not modelled yet, "
                        "use a dense model")
    hf = validate(HfConfig, value, origin)
    if hf.model_type not in FAMILIES:
        raise SpecError(f"{origin}: model_type '{hf.model_type}' is not supported; supported: "
                        f"{', '.join(FAMILIES)} (or write the architecture inline: layers, hidden, ...)")
    dtype = hf.torch_dtype or hf.dtype or "bfloat16"
    if dtype not in DTYPE_BYTES:
        raise SpecError(f"{origin}: field 'torch_dtype': '{dtype}' is not one of {', '.join(DTYPE_BYTES)}")
    qkv_bias, qk_norm, head_dim = FAMILIES[hf.model_type]
    heads = hf.num_attention_heads
    spec = {
        "name": name, "layers": hf.num_hidden_layers, "hidden": hf.hidden_size, "heads": heads,
        "kv_heads": hf.num_key_value_heads or heads, "head_dim": hf.head_dim or head_dim,
        "intermediate": hf.intermediate_size, "vocab": hf.vocab_size, "tied_embeddings": hf.tie_word_embeddings,
        "qkv_bias": qkv_bias if hf.attention_bias is None else hf.attention_bias, "qk_norm": qk_norm,
        "bytes_per_param": DTYPE_BYTES[dtype], "max_context": hf.max_position_embeddings, "source": origin,
    }
    if heads % spec["kv_heads"]:
        raise SpecError(f"{origin}: field 'num_key_value_heads': {spec['kv_heads']} must divide "
                        f"num_attention_heads ({heads})")
    if not name:
        raise SpecError(f"{origin}: an inline hf_config has no name; add name: to the model")
    return validate(ModelSpec, spec, origin)


def default_name(path: Path) -> str:
    """A model's name from its config file: the folder of a config.json (in the Hugging Face cache,
    models--Org--Name/snapshots/<commit>/config.json, the Name), else the file's stem."""
    if path.stem != "config":
        return path.stem.lower()
    folder = path.parent
    if re.fullmatch(r"[0-9a-f]{40}", folder.name) and folder.parent.parent.name.startswith("models--"):
        return folder.parent.parent.name.rsplit("--", 1)[-1].lower()
    return folder.name.lower() or "model"


def model_from_hf_entry(entry: dict[str, Any]) -> ModelSpec:
    """A workload's `model: {hf_config: PATH or mapping, name: ...}` (PATH already made absolute)."""
    extra = sorted(set(entry) - {"hf_config", "name"})
    if extra:
        raise SpecError(f"with hf_config a model takes only name; remove '{extra[0]}'")
    config, name = entry["hf_config"], entry.get("name")
    if name is not None and not isinstance(name, str):
        raise SpecError(f"name must be text, got {name!r}")
    if isinstance(config, str):
        path = Path(config)
        return model_from_hf(load_yaml(path), name or default_name(path), f"hf_config {path}")
    return model_from_hf(config, name, "hf_config")
