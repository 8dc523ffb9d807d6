"""LoRA training: what a rank-r adapter on every linear layer changes about a training step.

LoRA (Hu et al. 2021, arXiv:2106.09685) freezes the base weights W and trains B A beside each
(A: r x d_in, B: d_out x r), so an adapted d_in x d_out layer adds r (d_in + d_out) parameters.
Adapted here: every projection of the decoder layers, as PEFT's `target_modules="all-linear"`
does (q, k, v, o; gate, up, down; each routed and shared expert's; the MoE router), not the LM
head (PEFT leaves the output layer out). What follows for the step (roofline.train_seconds):
- no weight-gradient GEMMs for the frozen base: the backward is one matmul pass (input
  gradients) instead of two, so a step is 4 P (+ the adapter's 6 P_a) FLOPs per token instead
  of 6 P ("with frozen base weights [the backward] should be closer to once [the forward]",
  Hugging Face's blog "Async GRPO with LoRA across Hugging Face Jobs", github:huggingface/blog
  asyncgrpo-lora-hfjobs.md @081e91b);
- gradients, fp32 master weights and Adam moments exist only for the adapter; the base is held
  in bf16 (traces.costmodel.roofline.train_state_parts);
- data-parallel traffic: ZeRO-3 still gathers the frozen base for the forward and the backward,
  but only the adapter's gradients are reduced;
- weight sync moves the adapter alone (vLLM loads LoRA adapters at run time: its
  /v1/load_lora_adapter), two tensors (A and B) per adapted layer.
"""

from __future__ import annotations

from traces.errors import SpecError
from traces.models import ModelSpec

ADAPTER_BYTES_PER_PARAM = 2.0  # adapters are kept and sent in bf16


def check_lora(model: ModelSpec, rank: int, field: str = "lora_rank", off: str = "lora_rank: 0") -> None:
    """A rank the adapter formula can price on this model (raises SpecError naming `field` and the fix;
    `off` is how the caller's input turns LoRA off)."""
    if rank < 0:
        raise SpecError(f"{field} {rank} is negative: use 0 (full fine-tuning) or a positive rank")
    if rank and model.mla is not None:
        raise SpecError(f"{field} on {model.name}'s latent attention (mla) is not modelled: set {off}")
    if rank >= model.hidden:
        raise SpecError(f"{field} {rank} is not below {model.name}'s hidden size {model.hidden}: "
                        "a low-rank adapter must be narrower than the layer; lower it")


def _attention(model: ModelSpec) -> list[tuple[int, int]]:
    h, q, kv = model.hidden, model.q_dim, model.kv_dim
    return [(h, q), (h, kv), (h, kv), (q, h)]


def _dense_mlp(model: ModelSpec) -> list[tuple[int, int]]:
    h, ff = model.hidden, model.intermediate
    return [(h, ff), (h, ff), (ff, h)] if model.gated_mlp else [(h, ff), (ff, h)]


def _moe_mlp(model: ModelSpec, experts: int) -> list[tuple[int, int]]:
    """The router and the gate, up and down of `experts` routed experts and the shared ones."""
    assert model.moe is not None
    h, ffe = model.hidden, model.moe.expert_intermediate
    return [(h, model.moe.experts)] + [(h, ffe), (h, ffe), (ffe, h)] * (experts + model.moe.shared_experts)


def _layers(model: ModelSpec, experts: int) -> list[tuple[int, list[tuple[int, int]]]]:
    """(how many layers, their adapted projections as (d_in, d_out)), with `experts` routed experts a layer."""
    if model.moe is None:
        return [(model.layers, _attention(model) + _dense_mlp(model))]
    return [(model.moe.dense_layers, _attention(model) + _dense_mlp(model)),
            (model.moe_layers, _attention(model) + _moe_mlp(model, experts))]


def _width(model: ModelSpec, experts: int) -> int:
    """Sum of d_in + d_out over the adapted projections of all decoder layers."""
    return sum(n * sum(a + b for a, b in linears) for n, linears in _layers(model, experts))


def adapted_linears(model: ModelSpec) -> list[tuple[int, list[tuple[int, int]]]]:
    """(how many layers, the (d_in, d_out) of the adapted projections one token passes in each): the
    dense layers' and, in an MoE model, the routed layers' with their experts_per_token experts."""
    return [(n, linears) for n, linears in _layers(model, 0 if model.moe is None else model.moe.experts_per_token)
            if n > 0]


def adapter_params(model: ModelSpec, rank: int) -> int:
    """Parameters of the whole adapter (every expert's included): r x sum(d_in + d_out)."""
    return max(rank, 0) * _width(model, 0 if model.moe is None else model.moe.experts)


def active_adapter_params(model: ModelSpec, rank: int) -> int:
    """Adapter parameters one token passes (routed experts: experts_per_token of them): its FLOPs."""
    return max(rank, 0) * _width(model, 0 if model.moe is None else model.moe.experts_per_token)


def flops_per_token_change(model: ModelSpec, rank: int, *, forward_only: bool = False) -> float:
    """What a LoRA step adds to full fine-tuning's FLOPs per token: no weight-gradient GEMMs for the
    frozen base (-2 P), the adapter's forward and backward (+6 P_a); a forward pass of the adapted
    model (the old policy's logprobs) adds the adapter's forward (+2 P_a); 0 without LoRA."""
    if rank <= 0:
        return 0.0
    if forward_only:
        return 2.0 * active_adapter_params(model, rank)
    return -2.0 * model.compute_params + 6.0 * active_adapter_params(model, rank)


def adapter_tensors(model: ModelSpec) -> int:
    """Named tensors of the adapter (A and B per adapted projection): a latency each in weight sync."""
    return 2 * sum(n * len(linears) for n, linears in _layers(model, 0 if model.moe is None else model.moe.experts))


def adapter_bytes(model: ModelSpec, rank: int) -> float:
    return adapter_params(model, rank) * ADAPTER_BYTES_PER_PARAM


def table_name(model: ModelSpec, rank: int) -> str:
    """The model name cost-table rows of a LoRA step or adapter sync are filed under: a LoRA step
    is not a full fine-tuning step of the same model, so the two never price each other."""
    return model.name if rank <= 0 else f"{model.name}+lora{rank}"
