"""Model architectures: the fields of a published config, and what follows from them.

A workload names a preset (traces/data/models.yaml), writes these fields inline, or points at a
Hugging Face config.json (traces/hf_config.py).
"""

from __future__ import annotations

from functools import cache

from pydantic import BaseModel, ConfigDict, Field, model_validator

from traces.errors import SpecError, did_you_mean
from traces.io import data_text, load_yaml_text, validate

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class ModelSpec(BaseModel):
    """A dense decoder-only transformer (Llama/Qwen/GPT family)."""

    model_config = _FROZEN

    name: str = Field(min_length=1, max_length=128)
    layers: int = Field(ge=1, le=1000)
    hidden: int = Field(ge=1, le=1_000_000)
    heads: int = Field(ge=1, le=10_000)
    kv_heads: int = Field(ge=1, le=10_000)
    head_dim: int | None = Field(default=None, ge=1, le=10_000)
    intermediate: int = Field(ge=1, le=10_000_000)
    vocab: int = Field(ge=1, le=10_000_000)
    tied_embeddings: bool = False
    gated_mlp: bool = True  # SwiGLU (3 matrices) vs GELU MLP (2)
    qkv_bias: bool = False
    qk_norm: bool = False
    # 0.125: a 1-bit weight; 8: fp64. Outside that it is a typo, and a near-zero value made the KV cache
    # near-free, so an engine batched without bound and a simulation ran for many minutes.
    bytes_per_param: float = Field(default=2.0, ge=0.125, le=8)
    max_context: int | None = Field(default=None, ge=1, le=100_000_000,
                                    description="longest sequence the model takes (max_position_embeddings)")
    source: str = ""

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        return self

    @property
    def dim_per_head(self) -> int:
        return self.head_dim if self.head_dim is not None else self.hidden // self.heads

    @property
    def q_dim(self) -> int:
        return self.heads * self.dim_per_head

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.dim_per_head

    @property
    def params_per_layer(self) -> int:
        attn = self.hidden * (self.q_dim + 2 * self.kv_dim) + self.q_dim * self.hidden
        if self.qkv_bias:
            attn += self.q_dim + 2 * self.kv_dim
        mlp = (3 if self.gated_mlp else 2) * self.hidden * self.intermediate
        norms = 2 * self.hidden + (2 * self.dim_per_head if self.qk_norm else 0)
        return attn + mlp + norms

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    @property
    def params(self) -> int:
        """Total parameter count (embeddings and LM head included)."""
        return self.layers * self.params_per_layer + self.embedding_params + self.hidden

    @property
    def compute_params(self) -> int:
        """Parameters that cost 2 FLOPs per token: all matmuls incl. the LM head, not the lookup."""
        return self.layers * self.params_per_layer + self.vocab * self.hidden

    @property
    def weight_bytes(self) -> float:
        return self.params * self.bytes_per_param

    @property
    def kv_bytes_per_token(self) -> float:
        """K and V for every layer, in the serving dtype."""
        return 2 * self.layers * self.kv_dim * self.bytes_per_param

    @property
    def n_tensors(self) -> int:
        """Named weight tensors in the HF layout (weight sync pays a latency per tensor)."""
        per_layer = 4 + (3 if self.gated_mlp else 2) + 2
        per_layer += 3 if self.qkv_bias else 0
        per_layer += 2 if self.qk_norm else 0
        return self.layers * per_layer + 2 + (0 if self.tied_embeddings else 1)


class _Presets(BaseModel):
    model_config = _FROZEN
    models: tuple[ModelSpec, ...]


@cache
def model_presets() -> dict[str, ModelSpec]:
    presets = validate(_Presets, load_yaml_text(data_text("models.yaml"), "models.yaml"), "models.yaml")
    return {m.name.lower(): m for m in presets.models}


def model_names() -> list[str]:
    return sorted(model_presets())


def get_model(name: str) -> ModelSpec:
    """A preset by name, case-insensitively."""
    if not isinstance(name, str):
        raise SpecError(f"model must be a preset name, got {name!r}")
    try:
        return model_presets()[name.strip().lower()]
    except KeyError:
        raise SpecError(f"unknown model '{name}'{did_you_mean(name, model_names())}") from None


def resolve_model(value: str | dict[str, object] | ModelSpec, origin: str = "model") -> ModelSpec:
    """A preset name, an inline architecture mapping, or a ModelSpec."""
    if isinstance(value, ModelSpec):
        return value
    if isinstance(value, str):
        return get_model(value)
    return validate(ModelSpec, value, origin)
