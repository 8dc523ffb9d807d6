"""A Hugging Face ``config.json`` read as a ModelSpec.

A workload's model may name the config file, or give its fields inline::

    model: {hf_config: models/Qwen2.5-7B-Instruct/config.json}     # relative to the workload file
    model: {hf_config: {model_type: llama, hidden_size: 4096, ...}, name: my-llama}

``name`` is optional with a file (default: the file's folder, or its stem when it is not called
config.json, lower-cased) and required inline. Fields read, with transformers' defaults when absent:

- ``model_type``: llama, mistral, qwen2 (q/k/v projections carry a bias) or qwen3 (q/k RMSNorm);
  mixture-of-experts: qwen3_moe, mixtral, deepseek_v3 (with MLA) or gpt_oss (traces/moe.py names the
  expert fields each reads; traces/mla.py the attention's);
- ``num_hidden_layers``, ``hidden_size``, ``num_attention_heads``, ``intermediate_size``, ``vocab_size``;
- ``num_key_value_heads`` (absent: one per attention head), ``head_dim`` (absent: hidden / heads;
  qwen3: 128), ``attention_bias`` (absent: the family's), ``tie_word_embeddings`` (absent: false),
  ``max_position_embeddings`` (the longest sample a workload may ask for), ``torch_dtype`` or
  ``dtype`` (bfloat16 / float16: 2 bytes per weight, float32: 4; absent: 2).

Every other field is ignored. An MoE config of another family (e.g. qwen2_moe, whose shared expert
has its own width and gate) is refused in one line. The mapping is written out here because
transformers (which has AutoConfig) is only in the runtime extra.
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
    "qwen3_moe": (False, True, None),  # Qwen3MoeConfig has no head_dim default: hidden / heads (modeling
    # falls back to it); the published Qwen3 MoE config.json files all write head_dim: 128
    "mixtral": (False, False, None),
    "deepseek_v3": (False, False, None),  # MLA: head widths come from the mla fields
    "gpt_oss": (True, False, 64),  # GptOssConfig(attention_bias=True, head_dim=64)
}
MOE_FAMILIES = ("qwen3_moe", "mixtral", "deepseek_v3", "gpt_oss")


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
    hf = validate(HfConfig, value, origin)
    moe = [f for f in MOE_FIELDS if value.get(f)]
    if moe and hf.model_type not in MOE_FAMILIES:
        raise SpecError(f"{origin}: field '{moe[0]}': mixture-of-experts model_type '{hf.model_type}' is not "
                        f"supported; supported: {', '.join(MOE_FAMILIES)} (or write the model inline with moe:)")
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
    if hf.model_type in MOE_FAMILIES:
        spec.update(moe_fields(hf.model_type, value, hf.num_hidden_layers, origin))
    if heads % spec["kv_heads"]:
        raise SpecError(f"{origin}: field 'num_key_value_heads': {spec['kv_heads']} must divide "
                        f"num_attention_heads ({heads})")
    if not name:
        raise SpecError(f"{origin}: an inline hf_config has no name; add name: to the model")
    return validate(ModelSpec, spec, origin)


class HfMoe(BaseModel):
    """The expert (and MLA) fields of an MoE config.json, as transformers names them."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    num_experts: StrictInt | None = Field(default=None, ge=1)
    num_local_experts: StrictInt | None = Field(default=None, ge=1)
    n_routed_experts: StrictInt | None = Field(default=None, ge=1)
    num_experts_per_tok: StrictInt | None = Field(default=None, ge=1)
    experts_per_token: StrictInt | None = Field(default=None, ge=1)  # OpenAI's own gpt-oss config
    moe_intermediate_size: StrictInt | None = Field(default=None, ge=1)
    intermediate_size: StrictInt = Field(ge=1)
    n_shared_experts: StrictInt | None = Field(default=None, ge=0)
    first_k_dense_replace: StrictInt = Field(default=0, ge=0)
    mlp_only_layers: list[StrictInt] = []
    decoder_sparse_step: StrictInt = Field(default=1, ge=1)
    q_lora_rank: StrictInt | None = Field(default=None, ge=1)
    kv_lora_rank: StrictInt | None = Field(default=None, ge=1)
    qk_nope_head_dim: StrictInt | None = Field(default=None, ge=1)
    qk_rope_head_dim: StrictInt | None = Field(default=None, ge=0)
    v_head_dim: StrictInt | None = Field(default=None, ge=1)


def moe_fields(model_type: str, value: dict[str, Any], layers: int, origin: str) -> dict[str, Any]:
    """The `moe` (and deepseek_v3's `mla`) entries of a ModelSpec from an MoE config.json."""
    hf = validate(HfMoe, value, origin)
    experts = hf.num_experts or hf.num_local_experts or hf.n_routed_experts
    top_k = hf.num_experts_per_tok or hf.experts_per_token
    for field, given in (("num_experts", experts), ("num_experts_per_tok", top_k)):
        if given is None:
            raise SpecError(f"{origin}: a {model_type} config needs '{field}'; add it")
    # Mixtral's and gpt-oss's experts are intermediate_size wide; Qwen3-MoE's and DeepSeek's have their own.
    width = hf.moe_intermediate_size if model_type in ("qwen3_moe", "deepseek_v3") else hf.intermediate_size
    if width is None:
        raise SpecError(f"{origin}: a {model_type} config needs 'moe_intermediate_size'; add it")
    dense = hf.first_k_dense_replace
    if hf.mlp_only_layers or hf.decoder_sparse_step != 1:
        leading = list(range(len(hf.mlp_only_layers)))
        if hf.decoder_sparse_step != 1 or sorted(hf.mlp_only_layers) != leading:
            raise SpecError(f"{origin}: field 'mlp_only_layers': only leading dense layers are modelled "
                            f"(e.g. {leading or [0]}), with decoder_sparse_step 1")
        dense = len(leading)
    if dense >= layers:
        raise SpecError(f"{origin}: field 'first_k_dense_replace': {dense} leaves no MoE layer of {layers}")
    out: dict[str, Any] = {"moe": {"experts": experts, "experts_per_token": top_k, "expert_intermediate": width,
                                   "shared_experts": hf.n_shared_experts or 0, "dense_layers": dense,
                                   "biases": model_type == "gpt_oss"}}
    if model_type == "deepseek_v3":
        mla = {"q_lora_rank": hf.q_lora_rank, "kv_lora_rank": hf.kv_lora_rank,
               "qk_nope_head_dim": hf.qk_nope_head_dim, "qk_rope_head_dim": hf.qk_rope_head_dim,
               "v_head_dim": hf.v_head_dim}
        missing = [k for k, v in mla.items() if v is None and k != "q_lora_rank"]
        if missing:
            raise SpecError(f"{origin}: a deepseek_v3 config needs '{missing[0]}'; add it")
        out["mla"] = mla
    return out


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
