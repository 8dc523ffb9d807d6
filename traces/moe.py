"""Mixture-of-experts layers: the config fields, and how many experts a batch touches.

A model's ``moe`` block says which MLPs are routed: every layer after the first ``dense_layers``
replaces its dense MLP by ``experts`` routed experts (each a gated MLP ``expert_intermediate``
wide), of which a router picks ``experts_per_token`` per token, plus ``shared_experts`` that every
token passes (DeepSeek's). Parameter bytes count every expert; compute counts the active ones.

The config.json fields, per family (transformers' configuration_<type>.py):
- qwen3_moe / qwen2_moe: num_experts, num_experts_per_tok, moe_intermediate_size,
  mlp_only_layers / decoder_sparse_step (dense layers), shared_expert_intermediate_size (qwen2_moe);
- mixtral: num_local_experts, num_experts_per_tok, intermediate_size (the expert's width);
- deepseek_v3: n_routed_experts, num_experts_per_tok, moe_intermediate_size, n_shared_experts,
  first_k_dense_replace;
- gpt_oss: num_local_experts, num_experts_per_tok (experts_per_token in OpenAI's own config),
  intermediate_size; experts and router carry biases.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray
from pydantic import BaseModel, ConfigDict, Field, model_validator


class MoeSpec(BaseModel):
    """The routed MLPs of a mixture-of-experts model."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    experts: int = Field(ge=1, le=100_000, description="routed experts per MoE layer")
    experts_per_token: int = Field(ge=1, le=100_000, description="routed experts each token passes (top-k)")
    expert_intermediate: int = Field(ge=1, le=10_000_000, description="FFN width of one expert")
    shared_experts: int = Field(default=0, ge=0, le=1000, description="experts every token passes")
    dense_layers: int = Field(default=0, ge=0, le=1000, description="leading layers with a dense MLP")
    biases: bool = Field(default=False, description="router and expert projections carry biases (gpt-oss)")

    @model_validator(mode="after")
    def _check(self) -> MoeSpec:
        if self.experts_per_token > self.experts:
            raise ValueError(f"experts_per_token ({self.experts_per_token}) exceeds experts ({self.experts})")
        return self

    def expert_params(self, hidden: int) -> int:
        """One routed expert: gate, up and down projections (SwiGLU), with gpt-oss's biases."""
        bias = 2 * self.expert_intermediate + hidden if self.biases else 0
        return 3 * hidden * self.expert_intermediate + bias

    def router_params(self, hidden: int) -> int:
        return self.experts * hidden + (self.experts if self.biases else 0)


def attention_replicas(ep: ArrayLike) -> NDArray[np.float64]:
    """Attention replicas of an engine with `ep` expert-parallel ranks: one per GPU under EP (data-
    parallel attention), else 1. Each replica runs its own scheduler, so an engine's running-sequence
    cap (max_num_seqs, vLLM's per data-parallel rank) is this many times the per-replica one."""
    e = np.asarray(ep, dtype=np.float64)
    return np.where(e > 1, e, 1.0)


def expected_distinct_experts(experts: int, top_k: int, tokens: ArrayLike) -> NDArray[np.float64]:
    """Experts of one layer that `tokens` tokens touch together, in expectation, under uniform routing.

    Each token picks top_k distinct experts of E, so an expert is missed by one token with
    probability 1 - k/E, and by n independent tokens with (1 - k/E)^n; by linearity of expectation
    the experts hit are E (1 - (1 - k/E)^n): the classical occupancy expectation (Feller, An
    Introduction to Probability Theory and Its Applications, vol. 1, ch. II), with top-k draws.
    Trained routers are skewed, so real batches touch somewhat fewer experts than this.
    """
    n = np.maximum(np.asarray(tokens, dtype=np.float64), 0.0)
    return experts * (1.0 - (1.0 - top_k / experts) ** n)
