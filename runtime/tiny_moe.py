"""Tiny mixture-of-experts models from a config: transformers' Qwen3-MoE and Mixtral, for CPU runs.

The same engine (runtime.engine) and trainer (runtime.trainer) run them as they run the tiny Llama:
both classes are ordinary causal LMs with a KV cache; only their MLPs are routed (a router picks
`experts_per_token` of `experts` gated MLPs per token). The catalog's `tiny-qwen3-moe` (traces'
models.yaml) is the toy's shape; `python -m runtime.tiny_hf DIR --family qwen3_moe` writes one with a
subword tokenizer. Router auxiliary losses stay off (`output_router_logits` False, transformers'
default): the RL loss alone trains the router, as verl and AReaL train MoE policies by default.

Trainer tensor parallelism (runtime.tensor_parallel) splits dense MLP columns only, so an MoE model's
trainer runs tp 1 (`moe_tp_refusal`); dp ranks hold full replicas and run.
"""

from __future__ import annotations

from transformers import MixtralConfig, PretrainedConfig, Qwen3MoeConfig

from traces.moe import MoeSpec

MOE_FAMILIES = ("qwen3_moe", "mixtral")


def moe_config(family: str, moe: MoeSpec, common: dict[str, object]) -> PretrainedConfig:
    """A Qwen3-MoE or Mixtral config from the dense fields `common` (vocab, hidden, heads, ...) and `moe`.

    Field names: transformers' configuration_qwen3_moe.py (num_experts, num_experts_per_tok,
    moe_intermediate_size, decoder_sparse_step, mlp_only_layers) and configuration_mixtral.py
    (num_local_experts, num_experts_per_tok, intermediate_size = one expert's width)."""
    if moe.shared_experts or moe.biases:
        raise ValueError("the tiny MoE models have routed experts only (no shared experts, no biases)")
    if family == "qwen3_moe":
        # head_dim written out: a config.json without it reads as 128 in traces.hf_config (Qwen3's published
        # default), while transformers 5 builds hidden / heads
        head_dim = int(common["hidden_size"]) // int(common["num_attention_heads"])  # type: ignore[call-overload]
        return Qwen3MoeConfig(**common, head_dim=head_dim, num_experts=moe.experts,
                              num_experts_per_tok=moe.experts_per_token,
                              moe_intermediate_size=moe.expert_intermediate, decoder_sparse_step=1,
                              mlp_only_layers=list(range(moe.dense_layers)), norm_topk_prob=True)
    if family == "mixtral":
        if moe.dense_layers:
            raise ValueError("Mixtral routes every layer's MLP; dense_layers must be 0")
        dense = {k: v for k, v in common.items() if k != "intermediate_size"}
        return MixtralConfig(**dense, intermediate_size=moe.expert_intermediate, num_local_experts=moe.experts,
                             num_experts_per_tok=moe.experts_per_token)
    raise ValueError(f"MoE family {family!r}: the tiny MoE models are {', '.join(MOE_FAMILIES)}")


def is_moe(config: PretrainedConfig) -> bool:
    """Routed experts in the model (any family transformers names them for)."""
    return any(getattr(config, key, None) for key in ("num_experts", "num_local_experts", "n_routed_experts"))


def moe_tp_refusal(config: PretrainedConfig, tp: int) -> str | None:
    """Why a trainer of `tp` ranks cannot train this model (None: it can)."""
    if tp > 1 and is_moe(config):
        return (f"trainer tp={tp} on a mixture-of-experts model: the runtime's tensor-parallel plan splits dense "
                "MLPs only (expert parallelism is planned, not run); use tp 1 (dp ranks run)")
    return None
