"""Multi-head latent attention (DeepSeek-V2/V3): low-rank queries and a compressed, shared KV cache.

Fields as in DeepSeek-V3's config.json (q_lora_rank, kv_lora_rank, qk_nope_head_dim,
qk_rope_head_dim, v_head_dim). Projections, per transformers' DeepseekV3Attention:
q_a (hidden x q_lora) + its norm + q_b (q_lora x heads (nope + rope)), or q_proj without q_lora;
kv_a (hidden x (kv_lora + rope)) + its norm; kv_b (kv_lora x heads (nope + v)); o (heads v x hidden).
The cache holds the latent and the rope key, (kv_lora + rope) values per layer (DeepSeek-V2 paper,
arXiv:2405.04434, sec. 2.1.2), the same on every TP rank (vLLM's MLA backend replicates it).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class MlaSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    q_lora_rank: int | None = Field(default=None, ge=1, le=1_000_000)
    kv_lora_rank: int = Field(ge=1, le=1_000_000)
    qk_nope_head_dim: int = Field(ge=1, le=10_000)
    qk_rope_head_dim: int = Field(ge=0, le=10_000)
    v_head_dim: int = Field(ge=1, le=10_000)

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def params(self, hidden: int, heads: int) -> int:
        """Attention parameters of one layer (the two latent RMSNorms included)."""
        q_out = heads * self.qk_head_dim
        if self.q_lora_rank is None:
            q = hidden * q_out
        else:
            q = hidden * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * q_out
        kv = hidden * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
        kv += self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim)
        return q + kv + heads * self.v_head_dim * hidden

    @property
    def cache_values_per_layer(self) -> int:
        return self.kv_lora_rank + self.qk_rope_head_dim
