"""`rlfleet costs`: price one stage on one GPU type with the cost model.

``--cluster FILE`` lets ``--gpu`` (``--from``/``--to`` for sync) name a GPU type that cluster file
declares under ``gpus:``. ``prefill`` prices one sequence of ``--tokens`` tokens, or a batch of
``--prompts`` prompts of ``--prompt-len`` tokens each (attention runs within each prompt).
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from planner.commands.args import emit, positive_float, positive_int
from traces import CostModel, GpuType, ModelSpec, SpecError, get_model, load_cluster
from traces.cluster import DEFAULT_INTER_NODE_GB_PER_S, MAX_GB_PER_S, MIN_GB_PER_S
from traces.costmodel.roofline import train_flops_per_token
from traces.hardware import find_gpu, gpu_catalog
from traces.lora import adapter_bytes, check_lora, flops_per_token_change
from traces.plan_check import ep_shards
from traces.workload import TRAINER_KERNELS

NODE_TP = (1, 2, 4, 8)



def gb_per_s(text: str) -> float:
    """A network bandwidth flag, within the range a cluster file's links may have (traces.cluster)."""
    value = positive_float(text)
    if not MIN_GB_PER_S <= value <= MAX_GB_PER_S:
        raise argparse.ArgumentTypeError(f"must be between {MIN_GB_PER_S} and {MAX_GB_PER_S:,.0f} GB/s, got {text}")
    return value

def register(sub: Any) -> None:
    p = sub.add_parser("costs", help="price decode, prefill, train or sync with the cost model")
    stages = p.add_subparsers(dest="stage", required=True, metavar="STAGE")

    d = stages.add_parser("decode", help="seconds for one decode iteration of B sequences at mean context L")
    _common(d)
    d.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel degree (default 1)")
    d.add_argument("--ep", type=positive_int, default=1,
                   help="MoE models: expert-parallel ranks, 1 or --tp (data-parallel attention; default 1)")
    d.add_argument("--batch", type=positive_int, required=True, help="running sequences B")
    d.add_argument("--context", type=positive_int, required=True, help="mean context length L, tokens")
    d.add_argument("--enforce-eager", action="store_true",
                   help="an engine without CUDA graphs (vLLM enforce_eager): its kernel launches added")
    d.set_defaults(handler=decode)

    f = stages.add_parser("prefill", help="seconds to prefill one N-token prompt or a batch of N prompts")
    _common(f)
    f.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel degree (default 1)")
    f.add_argument("--tokens", type=positive_int, help="tokens of one prompt (or use --prompts and --prompt-len)")
    f.add_argument("--prompts", type=positive_int, help="prompts in the batch, N (with --prompt-len)")
    f.add_argument("--prompt-len", type=positive_int, help="tokens per prompt, L (--prompts defaults to 1)")
    f.set_defaults(handler=prefill)

    t = stages.add_parser("train", help="seconds for one optimizer step over N tokens")
    _common(t)
    t.add_argument("--dp", type=positive_int, default=1, help="data-parallel degree")
    t.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel degree")
    t.add_argument("--pp", type=positive_int, default=1, help="pipeline-parallel degree")
    t.add_argument("--ep", type=positive_int, default=1,
                   help="MoE models: expert-parallel ranks among dp x tp (default 1)")
    t.add_argument("--tokens", type=positive_int, required=True, help="tokens per optimizer step N")
    t.add_argument("--seq-len", type=positive_int, default=4096, help="tokens per sequence (default 4096)")
    t.add_argument("--zero-stage", type=int, choices=(0, 1, 2, 3), default=3, help="ZeRO/FSDP stage (default 3)")
    t.add_argument("--recompute", choices=("none", "selective", "full"), default="selective",
                   help="activation recomputation (default selective)")
    t.add_argument("--gpus-per-node", type=positive_int, default=8)
    t.add_argument("--inter-node-gb-per-s", type=gb_per_s, default=DEFAULT_INTER_NODE_GB_PER_S,
                   help="per-GPU network bandwidth between nodes, GB/s")
    t.add_argument("--kernels", choices=TRAINER_KERNELS, default="fused",
                   help="fused: Megatron-Core with Transformer Engine (default); eager: Hugging Face modules op by "
                        "op, as verl's FSDP workers and TRL run them (the traffic between GEMMs adds)")
    _lora_arg(t)
    t.set_defaults(handler=train)

    s = stages.add_parser("sync", help="seconds to push new weights from a trainer to K engines")
    s.add_argument("--from", dest="src", required=True, help="trainer GPU type")
    s.add_argument("--to", dest="dst", required=True, help="rollout GPU type")
    s.add_argument("--model", required=True, help="model preset (see rlfleet catalog)")
    s.add_argument("--engines", type=positive_int, default=1, help="receiving engines K (default 1)")
    s.add_argument("--link-gb-per-s", type=gb_per_s, default=None,
                   help=f"path bandwidth, GB/s one way, as a cluster's inter_node_gb_per_s (the catalog's "
                        f"link_gb_per_s counts both directions; default: half of it for one type, "
                        f"{DEFAULT_INTER_NODE_GB_PER_S:g} GB/s between types)")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    _lora_arg(s)
    _cluster_arg(s)
    s.set_defaults(handler=sync)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpu", required=True, help="GPU type (see rlfleet catalog, or one --cluster declares)")
    p.add_argument("--model", required=True, help="model preset (see rlfleet catalog)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    _cluster_arg(p)


def _lora_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lora-rank", type=int, default=0, metavar="R",
                   help="LoRA: a rank-R adapter on every linear layer trains (and syncs), the base is frozen "
                        "(default 0: full fine-tuning)")


def _cluster_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cluster", metavar="YAML", help="cluster file whose own GPU types (gpus:) the GPU may name")


def _gpu(args: argparse.Namespace, name: str) -> GpuType:
    """A catalog type, or one the --cluster file declares."""
    if args.cluster:
        return load_cluster(args.cluster).resolve(name)
    return find_gpu(name, gpu_catalog(), "; for a type a cluster file declares, add --cluster FILE")


def _engine_fit_check(cm: CostModel, gpu: GpuType, model: ModelSpec, tp: int) -> bool:
    """True if one sequence fits at this TP; a SpecError if no TP within a node fits at all."""
    if tp > model.heads:
        raise SpecError(f"--tp {tp} exceeds the {model.heads} attention heads of {model.name}; lower --tp")
    if float(cm.kv_capacity_tokens(gpu, model, tp)) >= 1:
        return True
    fitting = [t for t in NODE_TP if float(cm.kv_capacity_tokens(gpu, model, t)) >= 1]
    if not fitting:
        raise SpecError(
            f"{model.name} ({model.weight_bytes / 1e9:.0f} GB of weights) fits no engine on {gpu.name}: "
            f"even TP8 leaves no room for a KV cache in 8 x {gpu.hbm_gb:.0f} GB; use a GPU with more memory"
        )
    return False


def _kv_note(cm: CostModel, gpu: GpuType, model: ModelSpec, capacity: float, fits: tuple[bool, bool], detail: str,
             overflow: str) -> str:
    """The memory line of decode and prefill; `fits` is (the weights fit, the KV cache holds the batch too)."""
    if fits[1]:
        return f"fits; KV cache {int(capacity):,} tokens{detail}"
    if fits[0]:
        return f"does NOT fit: the KV cache holds {int(capacity):,} tokens, {overflow}"
    return _fit_hint(cm, gpu, model)


def _ep(ep: int) -> str:
    return f" EP{ep}" if ep > 1 else ""


def _check_ep(model: ModelSpec, ep: int, ranks: int, engine: bool) -> None:
    why = ep_shards(model, ep, ranks, engine)
    if why is not None:
        raise SpecError(f"--ep {ep}: {why}")


def _fit_hint(cm: CostModel, gpu: GpuType, model: ModelSpec) -> str:
    fitting = [t for t in NODE_TP if float(cm.kv_capacity_tokens(gpu, model, t)) >= 1]
    return f"does not fit; the smallest TP that fits is {fitting[0]}" if fitting else "does not fit"


def decode(args: argparse.Namespace) -> int:
    cm, gpu, model = CostModel(), _gpu(args, args.gpu), get_model(args.model)
    _check_ep(model, args.ep, args.tp, engine=True)
    weights_fit = _engine_fit_check(cm, gpu, model, args.tp)
    est = cm.decode(gpu, model, args.tp, args.batch, args.context, args.ep, enforce_eager=args.enforce_eager)
    capacity = float(cm.kv_capacity_tokens(gpu, model, args.tp, args.ep))
    max_batch = int(cm.max_batch(gpu, model, args.tp, args.context, args.ep))
    fits = weights_fit and args.batch * args.context <= capacity
    seconds = float(est.seconds)
    obj = {
        "stage": "decode", "gpu": gpu.name, "model": model.name, "tp": args.tp, "ep": args.ep, "batch": args.batch,
        "context": args.context, "seconds": seconds, "source": str(est.source), "fits": fits,
        "max_batch": max_batch, "kv_capacity_tokens": int(capacity), "tokens_per_s": args.batch / seconds,
    }
    note = _kv_note(cm, gpu, model, capacity, (weights_fit, fits), f", max batch at this context {max_batch}",
                    f"at most {max_batch} sequences")
    emit(obj, args.json, [
        f"decode {model.name} on {gpu.name} TP{args.tp}{_ep(args.ep)}, batch {args.batch} at context {args.context}:",
        f"  {seconds * 1e3:.2f} ms per iteration ({args.batch / seconds:,.0f} tokens/s)  [source: {est.source}]",
        f"  memory: {note}",
    ])
    return 0


def _prompt_batch(args: argparse.Namespace) -> tuple[int, int]:
    """(prompts, tokens per prompt) from --tokens, or from --prompts and --prompt-len."""
    if args.tokens is not None:
        if args.prompts is not None or args.prompt_len is not None:
            raise SpecError("costs prefill: give --tokens (one prompt) or --prompts with --prompt-len (a batch), "
                            "not both")
        return 1, args.tokens
    if args.prompt_len is None:
        raise SpecError("costs prefill: give --tokens N (one prompt), or --prompts N --prompt-len L (a batch)")
    return args.prompts or 1, args.prompt_len


def prefill(args: argparse.Namespace) -> int:
    prompts, prompt_len = _prompt_batch(args)
    cm, gpu, model = CostModel(), _gpu(args, args.gpu), get_model(args.model)
    weights_fit = _engine_fit_check(cm, gpu, model, args.tp)
    tokens = prompts * prompt_len
    est = cm.prefill(gpu, model, args.tp, tokens, prompt_len)  # attention within each prompt, not across
    capacity = float(cm.kv_capacity_tokens(gpu, model, args.tp))
    fits = weights_fit and tokens <= capacity
    seconds = float(est.seconds)
    obj = {"stage": "prefill", "gpu": gpu.name, "model": model.name, "tp": args.tp, "prompts": prompts,
           "prompt_len": prompt_len, "tokens": tokens, "seconds": seconds, "source": str(est.source), "fits": fits,
           "kv_capacity_tokens": int(capacity), "tokens_per_s": tokens / seconds}
    note = _kv_note(cm, gpu, model, capacity, (weights_fit, fits), "", f"the batch needs {tokens:,}")
    batch = f"{prompts} prompts of {prompt_len} tokens" if prompts > 1 else f"{prompt_len} tokens"
    emit(obj, args.json, [
        f"prefill {batch} of {model.name} on {gpu.name} TP{args.tp}:",
        f"  {seconds * 1e3:.2f} ms ({tokens / seconds:,.0f} tokens/s)  [source: {est.source}]",
        f"  memory: {note}",
    ])
    return 0


def _max_sequences(cm: CostModel, gpu: GpuType, model: ModelSpec, args: argparse.Namespace) -> int:
    """Most sequences of --seq-len per micro-batch that fit memory (0: not even one)."""
    n = np.arange(1, 1025)
    mem = cm.train_memory_bytes(gpu, model, args.dp, args.tp, args.pp, microbatch_tokens=n * args.seq_len,
                                seq_len=args.seq_len, zero_stage=args.zero_stage, recompute=args.recompute,
                                ep=args.ep, lora_rank=args.lora_rank)
    ok = n[mem <= gpu.hbm_bytes]
    return int(ok.max()) if ok.size else 0


def train(args: argparse.Namespace) -> int:
    cm, gpu, model = CostModel(), _gpu(args, args.gpu), get_model(args.model)
    if args.pp > model.layers:
        raise SpecError(f"--pp {args.pp} exceeds the {model.layers} layers of {model.name}; lower --pp")
    if args.tp > model.heads:
        raise SpecError(f"--tp {args.tp} exceeds the {model.heads} attention heads of {model.name}; lower --tp")
    _check_ep(model, args.ep, args.dp * args.tp, engine=False)
    check_lora(model, args.lora_rank, "--lora-rank", "--lora-rank 0")
    mb = min(args.seq_len, args.tokens)
    kw = {"seq_len": args.seq_len, "zero_stage": args.zero_stage, "recompute": args.recompute, "ep": args.ep,
          "lora_rank": args.lora_rank}
    est = cm.train(gpu, model, args.dp, args.tp, args.pp, args.tokens, microbatch_tokens=mb,
                   gpus_per_node=args.gpus_per_node, inter_node_bytes_per_s=args.inter_node_gb_per_s * 1e9,
                   kernels=args.kernels, **kw)
    memory = float(cm.train_memory_bytes(gpu, model, args.dp, args.tp, args.pp, microbatch_tokens=mb, **kw))
    fits = memory <= gpu.hbm_bytes
    seconds = float(est.seconds)
    gpus = args.dp * args.tp * args.pp
    # model FLOPs per token (6 P + attention); a LoRA step does no weight-gradient GEMMs for the base (traces.lora)
    flops = float(train_flops_per_token(model, args.seq_len)) + flops_per_token_change(model, args.lora_rank)
    mfu = flops * args.tokens / (seconds * gpus * gpu.bf16_flops)
    obj = {
        "stage": "train", "gpu": gpu.name, "model": model.name, "dp": args.dp, "tp": args.tp, "pp": args.pp,
        "ep": args.ep, "lora_rank": args.lora_rank, "kernels": args.kernels, "tokens": args.tokens, "seconds": seconds,
        "source": str(est.source), "fits": fits,
        "memory_bytes_per_gpu": memory, "max_batch": _max_sequences(cm, gpu, model, args), "mfu": mfu,
        "tokens_per_s": args.tokens / seconds,
    }
    verdict = "fits" if fits else "does NOT fit: raise --dp (ZeRO-3 shards states), --tp or --pp"
    emit(obj, args.json, [
        f"train {model.name}{f' (LoRA rank {args.lora_rank})' if args.lora_rank else ''} on {gpus} x {gpu.name} "
        f"(dp{args.dp} tp{args.tp} pp{args.pp}{_ep(args.ep).lower()}), {args.tokens:,} tokens:",
        f"  {seconds:.3f} s per optimizer step ({args.tokens / seconds:,.0f} tokens/s, MFU {mfu:.1%})"
        f"  [source: {est.source}]",
        f"  memory: {memory / 1e9:.1f} GB per GPU of {gpu.hbm_gb:.0f} GB, {verdict}; "
        f"max {obj['max_batch']} sequences of {args.seq_len} per micro-batch",
    ])
    return 0


def sync(args: argparse.Namespace) -> int:
    cm, src, dst, model = CostModel(), _gpu(args, args.src), _gpu(args, args.dst), get_model(args.model)
    if args.link_gb_per_s is not None:
        path = args.link_gb_per_s * 1e9
    elif src.name == dst.name:
        path = src.link_bytes_per_s  # same node type: assume the intra-node link
    else:
        path = DEFAULT_INTER_NODE_GB_PER_S * 1e9
    check_lora(model, args.lora_rank, "--lora-rank", "--lora-rank 0")
    est = cm.sync(src, model, args.engines, path, args.lora_rank)
    seconds = float(est.seconds)
    size = adapter_bytes(model, args.lora_rank) if args.lora_rank else model.weight_bytes
    what = f"'s rank-{args.lora_rank} LoRA adapter" if args.lora_rank else ""
    obj = {"stage": "sync", "from": src.name, "to": dst.name, "model": model.name, "engines": args.engines,
           "seconds": seconds, "source": str(est.source), "bytes": size, "path_bytes_per_s": path,
           "lora_rank": args.lora_rank}
    emit(obj, args.json, [
        f"sync {model.name}{what} ({size / 1e9:.3g} GB) from {src.name} to {args.engines} "
        f"{dst.name} engine(s) over {path / 1e9:.0f} GB/s:",
        f"  {seconds:.3f} s  [source: {est.source}]",
    ])
    return 0
