"""Model architectures: the fields of a published config, and what follows from them.

A workload names a preset (traces/data/models.yaml), writes these fields inline, or points at a
Hugging Face config.json (traces/hf_config.py). Mixture-of-experts models add a `moe` block
(traces/moe.py) and DeepSeek's latent attention an `mla` block (traces/mla.py): `params` and
`weight_bytes` count every expert, `active_params` and `compute_params` the ones a token passes.
"""

from __future__ import annotations

from functools import cache

from pydantic import BaseModel, ConfigDict, Field, model_validator

from traces.errors import SpecError, did_you_mean
from traces.io import data_text, load_yaml_text, validate
from traces.mla import MlaSpec
from traces.moe import MoeSpec

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class ModelSpec(BaseModel):
    """A decoder-only transformer (Llama/Qwen/GPT family), dense or with routed experts (`moe`)."""

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
    moe: MoeSpec | None = Field(default=None, description="routed experts (traces/moe.py); None: dense")
    mla: MlaSpec | None = Field(default=None, description="multi-head latent attention (traces/mla.py)")
    source: str = ""

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.moe is not None and self.moe.dense_layers >= self.layers:
            raise ValueError(f"moe.dense_layers ({self.moe.dense_layers}) must be below layers ({self.layers}); "
                             "drop moe for a dense model")
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
    def attn_dim(self) -> int:
        """Mean of the query-key and value widths over all heads: attention costs 4 x this FLOPs per
        (token, context token, layer) forward. q_dim for standard attention."""
        if self.mla is None:
            return self.q_dim
        return self.heads * (self.mla.qk_head_dim + self.mla.v_head_dim) // 2

    @property
    def moe_layers(self) -> int:
        return 0 if self.moe is None else self.layers - self.moe.dense_layers

    @property
    def attention_params_per_layer(self) -> int:
        """Attention projections and the layer's norms (the same in every layer)."""
        norms = 2 * self.hidden + (2 * self.dim_per_head if self.qk_norm else 0)
        if self.mla is not None:
            return self.mla.params(self.hidden, self.heads) + norms
        attn = self.hidden * (self.q_dim + 2 * self.kv_dim) + self.q_dim * self.hidden
        if self.qkv_bias:
            attn += self.q_dim + 2 * self.kv_dim
        return attn + norms

    @property
    def dense_mlp_params(self) -> int:
        return (3 if self.gated_mlp else 2) * self.hidden * self.intermediate

    @property
    def params_per_layer(self) -> int:
        """One dense layer (every layer of a dense model)."""
        return self.attention_params_per_layer + self.dense_mlp_params

    @property
    def expert_params(self) -> int:
        """Routed-expert parameters of the whole model: what expert parallelism shards."""
        if self.moe is None:
            return 0
        return self.moe_layers * self.moe.experts * self.moe.expert_params(self.hidden)

    def _moe_layer_params(self, experts: int) -> int:
        """One MoE layer's MLP parameters with `experts` routed experts: router, shared and routed."""
        assert self.moe is not None
        per_expert = self.moe.expert_params(self.hidden)
        return self.moe.router_params(self.hidden) + (self.moe.shared_experts + experts) * per_expert

    def _layers_params(self, routed: int) -> int:
        if self.moe is None:
            return self.layers * self.params_per_layer
        dense = self.moe.dense_layers * self.dense_mlp_params
        return self.layers * self.attention_params_per_layer + dense + self.moe_layers * self._moe_layer_params(routed)

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    @property
    def params(self) -> int:
        """Total parameter count (embeddings, LM head and every expert included)."""
        experts = 0 if self.moe is None else self.moe.experts
        return self._layers_params(experts) + self.embedding_params + self.hidden

    @property
    def active_params(self) -> int:
        """Parameters one token passes through (routed experts: experts_per_token of them)."""
        top_k = 0 if self.moe is None else self.moe.experts_per_token
        return self._layers_params(top_k) + self.embedding_params + self.hidden

    @property
    def compute_params(self) -> int:
        """Parameters that cost 2 FLOPs per token: the active matmuls incl. the LM head, not the lookup."""
        top_k = 0 if self.moe is None else self.moe.experts_per_token
        return self._layers_params(top_k) + self.vocab * self.hidden

    @property
    def weight_bytes(self) -> float:
        return self.params * self.bytes_per_param

    @property
    def expert_bytes(self) -> float:
        return self.expert_params * self.bytes_per_param

    @property
    def expert_bytes_each(self) -> float:
        """Bytes of one routed expert of one layer (0 for a dense model)."""
        return 0.0 if self.moe is None else self.moe.expert_params(self.hidden) * self.bytes_per_param

    @property
    def kv_bytes_per_token(self) -> float:
        """K and V for every layer (MLA: the latent and rope key), in the serving dtype."""
        if self.mla is not None:
            return self.layers * self.mla.cache_values_per_layer * self.bytes_per_param
        return 2 * self.layers * self.kv_dim * self.bytes_per_param

    @property
    def kv_shards(self) -> int:
        """Ways the KV cache splits over TP ranks at most: the KV heads (MLA's latent: not at all)."""
        return 1 if self.mla is not None else self.kv_heads

    @property
    def n_tensors(self) -> int:
        """Named weight tensors weight sync sends (a latency each): the HF layout, with each MoE
        layer's experts fused into gate-up and down tensors as the engines hold them (vLLM FusedMoE)."""
        attn = (7 if self.mla.q_lora_rank else 5) if self.mla is not None else 4
        attn += 3 if self.qkv_bias else 0
        attn += 2 if self.qk_norm else 0
        mlp = 3 if self.gated_mlp else 2
        per_layer = attn + 2
        total = self.layers * per_layer
        if self.moe is None:
            total += self.layers * mlp
        else:
            moe = 1 + 2 + (3 if self.moe.shared_experts else 0) + (3 if self.moe.biases else 0)
            total += self.moe.dense_layers * mlp + self.moe_layers * moe
        return total + 2 + (0 if self.tied_embeddings else 1)


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
