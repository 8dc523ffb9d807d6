"""A fleet: node groups of one GPU type each, with optional locality labels.

A cluster file may declare GPU types the catalog lacks in a top-level ``gpus:`` list, with the
fields of traces/data/gpus.yaml (documented in traces/hardware.py), and name them in its node groups::

    gpus:
      - {name: MyGPU, bf16_tflops: 400, hbm_gb: 64, hbm_tb_per_s: 2.0, link_gb_per_s: 400,
         host_gb_per_s: 64, link_kind: nvlink, price_per_gpu_hour: 1.1}
    node_groups:
      - {gpu_type: MyGPU, nodes: 2, gpus_per_node: 8}

Declared once, a type serves any number of groups (a group's ``price_per_gpu_hour`` still overrides
the price). The types belong to that cluster only: code that holds a cluster resolves names through
``Cluster.resolve``, so two clusters in one process may each declare a different "X". A declared
type may not reuse a catalog name or alias: give it its own name (changing only the price of a
catalog type is what the node group's ``price_per_gpu_hour`` is for).
"""

from __future__ import annotations

import os
from collections import Counter
from functools import cached_property

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from traces.errors import SpecError
from traces.hardware import GpuType, canonical_gpu_name, catalog_clash, find_gpu, gpu_key, gpu_table
from traces.io import data_files, data_text, load_yaml, load_yaml_text, validate

_FROZEN = ConfigDict(frozen=True, extra="forbid")

# A reasonable inter-node default when a file does not say: 400 Gb/s per GPU (NDR InfiniBand).
DEFAULT_INTER_NODE_GB_PER_S = 50.0
# Network bandwidths a fleet has: from 0.01 GB/s (80 Mb/s, a slow WAN link) to 10 TB/s (beyond any NIC
# or NVLink domain today); below that a weight sync takes days, which is a typo, not a fleet.
MIN_GB_PER_S, MAX_GB_PER_S = 0.01, 1e4


class NodeGroup(BaseModel):
    """`nodes` identical machines with `gpus_per_node` GPUs of `gpu_type` each."""

    model_config = _FROZEN

    gpu_type: str
    nodes: int = Field(ge=1, le=100_000)
    gpus_per_node: int = Field(default=8, ge=1, le=64)
    inter_node_gb_per_s: float = Field(
        default=DEFAULT_INTER_NODE_GB_PER_S, ge=MIN_GB_PER_S, le=MAX_GB_PER_S,
        description="per-GPU network bandwidth, GB/s",
    )
    label: str | None = Field(default=None, max_length=64, description="locality label (rack, region)")
    price_per_gpu_hour: float | None = Field(default=None, ge=0, le=1e4, description="override catalog price")

    @field_validator("gpu_type")
    @classmethod
    def _known(cls, value: str) -> str:
        return canonical_gpu_name(value)  # a name the catalog lacks is checked by the cluster

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


class LabelLink(BaseModel):
    """Bandwidth between two locality labels (per GPU pair path, GB/s)."""

    model_config = _FROZEN
    a: str
    b: str
    gb_per_s: float = Field(ge=MIN_GB_PER_S, le=MAX_GB_PER_S)


class Cluster(BaseModel):
    model_config = _FROZEN

    name: str = Field(default="cluster", max_length=128)
    gpus: tuple[GpuType, ...] = Field(default=(), max_length=100, description="this cluster's own GPU types")
    node_groups: tuple[NodeGroup, ...] = Field(min_length=1, max_length=1000)
    links: tuple[LabelLink, ...] = Field(default=(), max_length=10_000)

    @field_validator("gpus")
    @classmethod
    def _own_names(cls, gpus: tuple[GpuType, ...]) -> tuple[GpuType, ...]:
        seen: set[str] = set()
        for i, gpu in enumerate(gpus):
            clash = catalog_clash(gpu)
            if clash is not None:
                raise ValueError(f"'{clash}' (entry {i}) is a catalog GPU type; give yours another name "
                                 f"(e.g. '{gpu.name}-own'), or set price_per_gpu_hour on a node group to reprice it")
            names = {gpu_key(n) for n in (gpu.name, *gpu.aliases)}
            if names & seen:
                raise ValueError(f"'{sorted(names & seen)[0]}' (entry {i}) is declared twice; keep one declaration")
            seen |= names
        return gpus

    @field_validator("node_groups")
    @classmethod
    def _declared(cls, groups: tuple[NodeGroup, ...], info: ValidationInfo) -> tuple[NodeGroup, ...]:
        table = gpu_table(info.data.get("gpus", ()))
        for group in groups:
            find_gpu(group.gpu_type, table, "; or declare it in this file's gpus: list")
        return groups

    @model_validator(mode="after")
    def _check(self) -> Cluster:
        labels = {g.label for g in self.node_groups if g.label is not None}
        if labels and any(g.label is None for g in self.node_groups):
            raise ValueError("node_groups: either every group has a label or none does")
        known = {frozenset((lk.a, lk.b)) for lk in self.links}
        for lk in self.links:
            for end in (lk.a, lk.b):
                if end not in labels:
                    raise ValueError(f"links: label '{end}' is not used by any node group")
        sorted_labels = sorted(labels)
        for i, a in enumerate(sorted_labels):
            for b in sorted_labels[i + 1 :]:
                if frozenset((a, b)) not in known:
                    raise ValueError(f"links: no bandwidth between labels '{a}' and '{b}'; add a link")
        return self

    @cached_property
    def _table(self) -> dict[str, GpuType]:
        return gpu_table(self.gpus)

    def resolve(self, gpu_type: str) -> GpuType:
        """A GPU type by name or alias: this cluster's own types, then the catalog (catalog price)."""
        return find_gpu(gpu_type, self._table)

    def group_gpu(self, group: NodeGroup) -> GpuType:
        """A node group's GPU type, priced as the group says."""
        gpu = self.resolve(group.gpu_type)
        if group.price_per_gpu_hour is not None:
            gpu = gpu.model_copy(update={"price_per_gpu_hour": group.price_per_gpu_hour})
        return gpu

    @cached_property
    def gpu_counts(self) -> dict[str, int]:
        """Total GPUs per type (canonical names)."""
        counts: Counter[str] = Counter()
        for group in self.node_groups:
            counts[self.resolve(group.gpu_type).name] += group.gpus
        return dict(counts)

    @property
    def total_gpus(self) -> int:
        return sum(self.gpu_counts.values())

    def gpu(self, gpu_type: str) -> GpuType:
        """The GPU type as priced in this cluster (the first group's price override wins)."""
        groups = self.groups_of(gpu_type)
        if not groups:
            raise SpecError(f"cluster '{self.name}' has no {gpu_type} GPUs; it has {', '.join(self.gpu_counts)}")
        return self.group_gpu(groups[0])

    def groups_of(self, gpu_type: str) -> list[NodeGroup]:
        name = self.resolve(gpu_type).name
        return [g for g in self.node_groups if self.resolve(g.gpu_type).name == name]

    def group_of_node(self, node: int) -> NodeGroup:
        """The node group of a node index (nodes are numbered group by group, in file order)."""
        first = 0
        for group in self.node_groups:
            if first <= node < first + group.nodes:
                return group
            first += group.nodes
        raise SpecError(f"node {node} does not exist: cluster '{self.name}' has {first} nodes (0-{first - 1})")

    def label_bandwidth(self, a: str | None, b: str | None) -> float | None:
        """Bytes/s between two labels, None when they are the same place or unlabelled."""
        if a is None or b is None or a == b:
            return None
        for lk in self.links:
            if {lk.a, lk.b} == {a, b}:
                return lk.gb_per_s * 1e9
        return None


def load_cluster(path: str | os.PathLike[str]) -> Cluster:
    return validate(Cluster, load_yaml(path), str(path))


def example_clusters() -> list[str]:
    return [name.removesuffix(".yaml") for name in data_files("clusters")]


def example_cluster(name: str) -> Cluster:
    if name not in example_clusters():
        raise SpecError(f"unknown example cluster '{name}'; known: {', '.join(example_clusters())}")
    text = data_text(f"clusters/{name}.yaml")
    return validate(Cluster, load_yaml_text(text, f"{name}.yaml"), f"{name}.yaml")
