"""GPU types and the shipped catalog.

Catalog figures are published peak numbers (bf16 dense, no sparsity) and live in
``traces/data/gpus.yaml`` with their source and date; prices there are editable
defaults, not truths.
"""

from __future__ import annotations

from functools import cache

from pydantic import BaseModel, ConfigDict, Field

from traces.errors import SpecError, did_you_mean
from traces.io import data_text, load_yaml_text, validate

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class GpuType(BaseModel):
    """One accelerator type. YAML fields carry human units; properties give SI."""

    model_config = _FROZEN

    name: str = Field(min_length=1, max_length=64)
    aliases: tuple[str, ...] = ()
    bf16_tflops: float = Field(gt=0, le=1e5, description="dense bf16 peak, TFLOP/s")
    hbm_gb: float = Field(gt=0, le=1e4, description="HBM capacity, GB (1e9 bytes)")
    hbm_tb_per_s: float = Field(gt=0, le=1e3, description="HBM bandwidth, TB/s")
    link_gb_per_s: float = Field(gt=0, le=1e5, description="intra-node link, GB/s, bidirectional")
    link_kind: str = "nvlink"
    host_gb_per_s: float = Field(default=32, gt=0, le=1e4, description="PCIe link to host memory, GB/s, one way")
    price_per_gpu_hour: float = Field(ge=0, le=1e4)
    # Share of the datasheet peak that large GEMMs reach on this type. Hopper: 0.80, measured on
    # an H200 (calibration row K8: 790 of 989 TFLOP/s). Others: 1.0 until measured. The fitted
    # efficiencies (costmodel/efficiency.py) multiply this.
    matmul_ceiling: float = Field(default=1.0, gt=0, le=1)
    source: str = ""
    price_source: str = ""
    date: str = ""

    @property
    def bf16_flops(self) -> float:
        return self.bf16_tflops * 1e12

    @property
    def hbm_bytes(self) -> float:
        return self.hbm_gb * 1e9

    @property
    def hbm_bytes_per_s(self) -> float:
        return self.hbm_tb_per_s * 1e12

    @property
    def link_bytes_per_s(self) -> float:
        """One direction of the intra-node link (published figures count both)."""
        return self.link_gb_per_s * 1e9 / 2

    @property
    def host_bytes_per_s(self) -> float:
        return self.host_gb_per_s * 1e9


class Catalog(BaseModel):
    model_config = _FROZEN
    gpus: tuple[GpuType, ...]


def _key(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


@cache
def gpu_catalog() -> dict[str, GpuType]:
    """All shipped GPU types, keyed by lower-case name and alias."""
    catalog = validate(Catalog, load_yaml_text(data_text("gpus.yaml"), "gpus.yaml"), "gpus.yaml")
    table: dict[str, GpuType] = {}
    for gpu in catalog.gpus:
        for name in (gpu.name, *gpu.aliases):
            table[_key(name)] = gpu
    return table


def gpu_names() -> list[str]:
    return sorted({g.name for g in gpu_catalog().values()})


def get_gpu(name: str) -> GpuType:
    """Look up a GPU type by name or alias, case-insensitively."""
    if not isinstance(name, str):
        raise SpecError(f"GPU type must be a name, got {name!r}")
    try:
        return gpu_catalog()[_key(name)]
    except KeyError:
        raise SpecError(f"unknown GPU type '{name}'{did_you_mean(name, gpu_names())}") from None
