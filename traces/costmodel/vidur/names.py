"""Vidur's device and model folder names, mapped to rlfleet's catalog.

Vidur (github.com/microsoft/vidur, MIT) files its profiles as compute/<device>/<org>/<model>/mlp.csv
and network/<node>/all_reduce.csv. The node is the one whose GPUs match the catalog type: the
catalog's A100-80G and H100 are SXM parts on NVSwitch, Vidur's *_dgx nodes (8 GPUs, all-to-all).
"""

from __future__ import annotations

from dataclasses import dataclass

from traces.errors import SpecError
from traces.hardware import GpuType, get_gpu
from traces.models import ModelSpec, get_model


@dataclass(frozen=True)
class VidurGpu:
    folder: str  # compute/<folder>/
    catalog: str  # rlfleet's GPU type
    network: str  # network/<network>/all_reduce.csv


@dataclass(frozen=True)
class VidurModel:
    folder: str  # compute/<device>/<folder>/mlp.csv, a Hugging Face id
    catalog: str  # rlfleet's preset with the same layer shapes
    note: str = ""


GPUS: tuple[VidurGpu, ...] = (
    VidurGpu("a100", "A100-80G", "a100_dgx"),
    VidurGpu("h100", "H100", "h100_dgx"),
    # Vidur's A40 node joins pairs by NVLink bridges; its folder holds no all_reduce.csv, so A40 imports TP1
    VidurGpu("a40", "A40", "a40_pairwise_nvlink"),
)

MODELS: tuple[VidurModel, ...] = (
    VidurModel("meta-llama/Llama-2-7b-hf", "llama-2-7b"),
    VidurModel("meta-llama/Llama-2-70b-hf", "llama-2-70b"),
    # Llama 3.1 changed the RoPE scaling and context length only: the same layer shapes and vocab
    VidurModel("meta-llama/Meta-Llama-3-8B", "llama-3.1-8b", "Meta-Llama-3-8B's shapes"),
    VidurModel("meta-llama/Meta-Llama-3-70B", "llama-3.1-70b", "Meta-Llama-3-70B's shapes"),
    VidurModel("Qwen/Qwen-72B", "qwen-72b"),
)


def vidur_gpu(name: str) -> VidurGpu:
    """By Vidur's folder name (a100) or any catalog name or alias (A100-80G, A100)."""
    for gpu in GPUS:
        if name.strip().lower() == gpu.folder:
            return gpu
    try:
        catalog = get_gpu(name).name
    except SpecError:
        catalog = None
    for gpu in GPUS:
        if gpu.catalog == catalog:
            return gpu
    known = ", ".join(f"{g.folder} ({g.catalog})" for g in GPUS)
    raise SpecError(f"--gpu {name!r}: Vidur has no profiles for it; use one of {known}")


def vidur_model(name: str) -> VidurModel:
    """By Vidur's folder (meta-llama/Meta-Llama-3-8B) or the catalog preset (llama-3.1-8b)."""
    key = name.strip().lower()
    for model in MODELS:
        if key in (model.folder.lower(), model.catalog):
            return model
    known = ", ".join(f"{m.folder} ({m.catalog})" for m in MODELS)
    raise SpecError(f"--model {name!r}: no Vidur profile maps to rlfleet's catalog for it; use one of {known}")


def catalog_pair(gpu: VidurGpu, model: VidurModel) -> tuple[GpuType, ModelSpec]:
    return get_gpu(gpu.catalog), get_model(model.catalog)
