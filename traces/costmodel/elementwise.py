"""HBM traffic of a training pass outside its GEMMs, for trainers that run the model op by op.

A trainer built on Hugging Face transformers modules (verl's FSDP workers, TRL, OpenRLHF: `kernels:
eager`) runs every norm, rotary embedding, activation, residual add and the loss's softmax over the
vocabulary as its own kernel, each streaming its tensors through HBM. That time adds to the GEMMs'
(separate kernels do not overlap) and weighs most on small models: the GEMMs grow as hidden^2, this
traffic as hidden. Megatron-Core with Transformer Engine fuses these ops into the GEMMs' neighbours
(`kernels: fused`): their remaining cost is inside the fitted train_matmul, so no term here.

Bytes per token per layer, forward, bf16 activations (2 bytes) unless fp32 (4), counted from the op
sequence of transformers' Qwen2/Llama decoder layer (modeling_qwen2.py / modeling_llama.py):
- RMSNorm, twice a layer: x.to(float32) (read 2h, write 4h), pow(2).mean (read 4h), x * rsqrt(var + eps)
  (read 4h, write 4h), .to(bf16) (read 4h, write 2h), weight * x (read 2h, write 2h): 32 h;
- rotary on q and k: q * cos + rotate_half(q) * sin: rotate_half's slice and cat (read 2, write 2),
  two products (read 4 + 4, write 2 + 2) and the sum (read 4, write 2): 22 bytes per q and k value;
- gated MLP: act_fn(gate) (read 2 ff, write 2 ff) and its product with up (read 4 ff, write 2 ff): 10 ff;
  a plain MLP's activation alone: 4 ff;
- two residual adds (read 4 h, write 2 h each): 12 h;
- LoRA (traces.lora), per adapted projection d_in x d_out: lora_A reads x (2 d_in), lora_B writes
  2 d_out, the scaling reads and writes it (4 d_out), the sum with the base output reads both and
  writes it (6 d_out): 2 d_in + 12 d_out;
- the loss head: the logits (bf16, written by the head's GEMM) are read in fp32 for the logprobs and
  entropy, three passes (max, exp-sum, the selected log-probability): 3 x 4 V bytes per token.
A backward pass reads each op's saved input and output gradient and writes its input gradient: about
twice the forward bytes; full recomputation runs the forward once more.
"""

from __future__ import annotations

from traces.lora import adapted_linears
from traces.models import ModelSpec

BACKWARD_PER_FORWARD = 2.0  # an elementwise op's backward streams about twice its forward bytes
LOSS_PASSES = 3  # reads of the fp32 logits per token: max, exp-sum, the selected log-probability


def forward_bytes_per_token(model: ModelSpec, lora_rank: int = 0) -> float:
    """HBM bytes per token of one eager forward pass outside the GEMMs (module docstring)."""
    h = model.hidden
    norms = 2 * 32 * h
    rotary = 22 * (model.q_dim + model.kv_dim)
    residual = 12 * h
    # (layers, the MLP width a token passes): an MoE model's leading dense layers, then its routed ones,
    # where a token passes experts_per_token routed (and the shared) experts
    widths = [(model.layers, model.intermediate)] if model.moe is None else [
        (model.moe.dense_layers, model.intermediate),
        (model.moe_layers, model.moe.expert_intermediate * (model.moe.experts_per_token + model.moe.shared_experts))]
    act = 10 if model.gated_mlp else 4
    total = sum(n * (norms + rotary + act * ff + residual) for n, ff in widths)
    if lora_rank > 0:
        total += sum(n * sum(2 * d_in + 12 * d_out for d_in, d_out in linears) for n, linears in adapted_linears(model))
    return float(total + LOSS_PASSES * 4 * model.vocab)


def pass_bytes_per_token(model: ModelSpec, kernels: str, *, forward_only: bool, recompute: str,
                         lora_rank: int = 0) -> float:
    """Bytes per token of a forward pass (forward_only) or a training step's passes; 0 for fused kernels."""
    if kernels == "fused":
        return 0.0
    forward = forward_bytes_per_token(model, lora_rank)
    if forward_only:
        return forward
    return forward * (1.0 + BACKWARD_PER_FORWARD + (1.0 if recompute == "full" else 0.0))
