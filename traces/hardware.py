"""GPU types and the shipped catalog.

Catalog figures are published peak numbers (bf16 dense, no sparsity) and live in
``traces/data/gpus.yaml`` with their source and date; prices there are editable
defaults, not truths.

A cluster file may declare its own types (``gpus:``, see traces/cluster.py) with the same fields:

- ``name``: letters, digits, space and ``. _ + - ( )``, at most 64; looked up case-insensitively,
  ``_`` and space read as ``-``. ``aliases``: other names for it.
- ``bf16_tflops`` (dense bf16 peak, TFLOP/s), ``hbm_gb`` (GB, 1e9 bytes), ``hbm_tb_per_s`` (TB/s),
  ``link_gb_per_s`` (intra-node GPU-to-GPU, both directions summed, as datasheets give it),
  ``host_gb_per_s`` (PCIe to host, one way; default 32), ``price_per_gpu_hour`` (any currency,
  used consistently): positive finite numbers (a price may be 0).
- ``link_kind``: a short label of the intra-node link (nvlink, pcie4, ...; up to 32 letters, digits,
  space, ``. _ + -``): shown, never computed with; ``link_gb_per_s`` is what the cost model uses.
- ``matmul_ceiling`` (share of the peak large GEMMs reach, 0-1, default 1), ``source``,
  ``price_source``, ``date``: optional.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from functools import cache
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from traces.errors import SpecError, did_you_mean
from traces.io import data_text, load_yaml_text, validate

# Numbers are strict (a YAML `true` is not 1) and finite; names are plain printable text.
_FROZEN = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9 ._+()-]{0,63}$"
GpuName = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=NAME_PATTERN)]


class GpuType(BaseModel):
    """One accelerator type. YAML fields carry human units; properties give SI."""

    model_config = _FROZEN

    name: GpuName
    aliases: tuple[GpuName, ...] = Field(default=(), max_length=16)
    bf16_tflops: float = Field(gt=0, le=1e5, strict=True, description="dense bf16 peak, TFLOP/s")
    hbm_gb: float = Field(gt=0, le=1e4, strict=True, description="HBM capacity, GB (1e9 bytes)")
    hbm_tb_per_s: float = Field(gt=0, le=1e3, strict=True, description="HBM bandwidth, TB/s")
    link_gb_per_s: float = Field(gt=0, le=1e5, strict=True, description="intra-node link, GB/s, bidirectional")
    link_kind: str = Field(default="nvlink", min_length=1, max_length=32, pattern=r"^[A-Za-z0-9][A-Za-z0-9 ._+-]*$")
    host_gb_per_s: float = Field(default=32, gt=0, le=1e4, strict=True,
                                 description="PCIe link to host memory, GB/s, one way")
    price_per_gpu_hour: float = Field(ge=0, le=1e4, strict=True)
    # Share of the datasheet peak that large GEMMs reach on this type. Hopper: 0.80, measured on
    # an H200 (calibration row K8: 790 of 989 TFLOP/s). Others: 1.0 until measured (gpus.yaml says why
    # A100's measurement is not applied). The fitted efficiencies (costmodel/efficiency.py) multiply this.
    matmul_ceiling: float = Field(default=1.0, gt=0, le=1, strict=True)
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
        """One direction of the intra-node link (published figures count both): the rate NCCL's bus
        bandwidth is held against (nccl-tests doc/PERFORMANCE.md), and the only place it is halved."""
        return self.link_gb_per_s * 1e9 / 2

    @property
    def host_bytes_per_s(self) -> float:
        return self.host_gb_per_s * 1e9


class Catalog(BaseModel):
    model_config = _FROZEN
    gpus: tuple[GpuType, ...]


def gpu_key(name: str) -> str:
    """The lookup key of a GPU name: case, `_` and space do not matter."""
    return name.strip().lower().replace("_", "-").replace(" ", "-")


def _table(gpus: Iterable[GpuType]) -> dict[str, GpuType]:
    table: dict[str, GpuType] = {}
    for gpu in gpus:
        for name in (gpu.name, *gpu.aliases):
            table[gpu_key(name)] = gpu
    return table


@cache
def gpu_catalog() -> dict[str, GpuType]:
    """All shipped GPU types, keyed by lower-case name and alias."""
    catalog = validate(Catalog, load_yaml_text(data_text("gpus.yaml"), "gpus.yaml"), "gpus.yaml")
    return _table(catalog.gpus)


def gpu_table(custom: Iterable[GpuType]) -> dict[str, GpuType]:
    """The catalog plus a cluster's own types (which must not reuse a catalog name: see catalog_clash)."""
    return {**gpu_catalog(), **_table(custom)}


def catalog_clash(gpu: GpuType) -> str | None:
    """The first of a custom type's names that the catalog already uses, if any."""
    return next((n for n in (gpu.name, *gpu.aliases) if gpu_key(n) in gpu_catalog()), None)


def gpu_names() -> list[str]:
    return sorted({g.name for g in gpu_catalog().values()})


def find_gpu(name: str, table: Mapping[str, GpuType], hint: str = "") -> GpuType:
    """Look up a GPU type by name or alias in `table` (gpu_catalog() or gpu_table()), case-insensitively."""
    if not isinstance(name, str):
        raise SpecError(f"GPU type must be a name, got {name!r}")
    try:
        return table[gpu_key(name)]
    except KeyError:
        known = sorted({g.name for g in table.values()})
        raise SpecError(f"unknown GPU type '{name}'{did_you_mean(name, known)}{hint}") from None


def get_gpu(name: str) -> GpuType:
    """A catalog GPU type by name or alias (a cluster's own types: Cluster.resolve)."""
    return find_gpu(name, gpu_catalog())


def canonical_gpu_name(name: str) -> str:
    """A catalog type's canonical name; another plain name as written (a cluster file may declare it)."""
    if isinstance(name, str) and gpu_key(name) not in gpu_catalog() and re.fullmatch(NAME_PATTERN, name.strip()):
        return name.strip()
    return get_gpu(name).name
