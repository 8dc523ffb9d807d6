"""Tensor parallelism of the trainer: torch's DTensor tensor-parallel API over a (dp, tp) device mesh.

What is split: the Megatron-LM layout (Shoeybi et al. 2019, "Megatron-LM", section 3), as the model's own
Hugging Face `base_model_tp_plan` names it: q/k/v and the MLP's gate/up projections are column-parallel
(each tp rank holds heads / tp attention heads and intermediate / tp MLP columns), o and down are
row-parallel (their partial sums are all-reduced over the tp ranks in the forward). Applied with
`torch.distributed.tensor.parallel.parallelize_module` (ColwiseParallel / RowwiseParallel); the
backward's all-reduce of the column-parallel inputs' gradients is DTensor's. Embeddings, norms and
the (tied) head stay whole on every tp rank: their gradients come out equal on every tp rank (the
same inputs, the same reduced activations), so they need no communication, at the price of holding
them in full (the vocabulary rows dominate a small model; a sharded vocabulary is not built).

The mesh is 2-D, (dp, tp), tp innermost: global rank = dp_index * tp + tp_index, so a tp group is
consecutive ranks (consecutive placement-group bundles, one node where the placement packs them).
Data parallelism runs over the mesh's dp dimension (runtime.parallel); this module averages the
gradients over it when tp > 1 (DDP wraps plain-tensor parameters).

Device and backend: gloo on CPU (tested here), NCCL on CUDA (wired the same way, not run here: no GPU).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel, parallelize_module
from transformers import PreTrainedModel

from traces.errors import SpecError

__all__ = ["STYLES", "average_gradients", "check_tp", "clip_grad_norm", "full", "mesh_for", "shard_like",
           "tensor_parallelize", "tp_plan"]

# the plan styles of Hugging Face's base_model_tp_plan that this trainer applies (Llama, Qwen2, Mistral
# use only these two); any other (sequence parallel, local or gathered variants) is refused by name
STYLES: dict[str, type[ParallelStyle]] = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}


def check_tp(tp: int, heads: int, kv_heads: int, intermediate: int) -> None:
    """SpecError unless tp ranks can split the attention heads, KV heads and MLP columns equally."""
    if tp < 1:
        raise SpecError(f"trainer tp={tp}: tp must be at least 1")
    for what, n in (("attention heads", heads), ("KV heads", kv_heads), ("MLP columns", intermediate)):
        if n % tp:
            raise SpecError(f"trainer tp={tp} cannot split the model's {n} {what} equally; use a tp that "
                            f"divides {heads} heads, {kv_heads} KV heads and {intermediate} MLP columns")


def mesh_for(device: torch.device, dp: int, tp: int) -> DeviceMesh:
    """The (dp, tp) mesh over torch's default process group, which must hold dp * tp ranks."""
    if dist.get_world_size() != dp * tp:
        raise ValueError(f"a dp={dp} x tp={tp} mesh needs {dp * tp} ranks; the process group has "
                         f"{dist.get_world_size()}")
    return init_device_mesh(device.type, (dp, tp), mesh_dim_names=("dp", "tp"))


def tp_plan(model: PreTrainedModel) -> dict[str, ParallelStyle]:
    """The model's Hugging Face tensor-parallel plan as torch styles, keyed relative to its base model."""
    plan = getattr(model.config, "base_model_tp_plan", None) or {}
    if not plan:
        raise SpecError(f"trainer tp > 1: {type(model).__name__} has no tensor-parallel plan "
                        "(config.base_model_tp_plan); use tp 1 for this model")
    unknown = sorted({style for style in plan.values() if style not in STYLES})
    if unknown:
        raise SpecError(f"trainer tp > 1: {type(model).__name__}'s plan uses {', '.join(unknown)}; this trainer "
                        f"applies only {', '.join(STYLES)} (use tp 1 for this model)")
    return {pattern: STYLES[style]() for pattern, style in plan.items()}


def tensor_parallelize(model: PreTrainedModel, mesh: DeviceMesh) -> None:
    """Shard `model`'s projections over the 1-D tp `mesh`, in place (the module tree and its state-dict keys
    stay the same; the sharded weights become DTensors)."""
    cfg, tp = model.config, mesh.size()
    check_tp(tp, cfg.num_attention_heads, getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads,
             cfg.intermediate_size)
    parallelize_module(model.base_model, mesh, tp_plan(model))


def full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor from a shard (an all-gather: every rank of its mesh must call it), or the tensor."""
    return tensor.full_tensor().detach() if isinstance(tensor, DTensor) else tensor.detach()


def shard_like(whole: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """This rank's part of `whole`, laid out as `like` (a DTensor) is; no communication (every rank holds
    `whole`, as after loading one checkpoint file), so each rank cuts its own part."""
    if not isinstance(like, DTensor):
        return whole.to(like.device, like.dtype)
    if tuple(whole.shape) != tuple(like.shape):
        raise ValueError(f"a tensor of shape {tuple(whole.shape)} cannot be laid out as one of {tuple(like.shape)}")
    return distribute_tensor(whole.to(like.device, like.dtype), like.device_mesh, like.placements,
                             src_data_rank=None)


def clip_grad_norm(params: Iterable[torch.nn.Parameter], max_norm: float) -> float:
    """`torch.nn.utils.clip_grad_norm_` over parameters some of which are DTensors: the global norm of all
    gradients (each sharded one's norm is reduced over its mesh by DTensor), then every gradient scaled."""
    with_grad = [p for p in params if p.grad is not None]
    # foreach kernels refuse lists mixing DTensors and tensors, so the two kinds are normed apart
    sharded = [p for p in with_grad if isinstance(p.grad, DTensor)]
    whole = [p for p in with_grad if not isinstance(p.grad, DTensor)]
    parts = [full(torch.nn.utils.get_total_norm([p.grad for p in group])).reshape(())
             for group in (sharded, whole) if group]
    if not parts:
        return 0.0
    total = torch.linalg.vector_norm(torch.stack([p.to(torch.float64) for p in parts])).to(parts[0].dtype)
    for group in (sharded, whole):
        if group:
            torch.nn.utils.clip_grads_with_norm_(group, max_norm, total.to(group[0].grad.device))
    return float(total)


def average_gradients(params: Sequence[torch.nn.Parameter], group: dist.ProcessGroup, size: int) -> None:
    """Mean of every gradient over the `size` ranks of `group` (the dp ranks), as DDP would take it: each
    rank's local part (a tp shard, or the whole tensor) flattened into one buffer, one all-reduce."""
    locals_ = [g.to_local() if isinstance(g, DTensor) else g
               for g in (p.grad for p in params) if g is not None]
    if size == 1 or not locals_:
        return
    buffer = torch.cat([t.reshape(-1) for t in locals_])
    dist.all_reduce(buffer, group=group)  # a sum: gloo has no average
    buffer /= size
    offset = 0
    for t in locals_:
        t.copy_(buffer[offset:offset + t.numel()].view_as(t))
        offset += t.numel()
