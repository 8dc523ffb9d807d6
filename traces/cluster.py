"""A fleet: node groups of one GPU type each, with optional locality labels."""

from __future__ import annotations

import os
from collections import Counter
from functools import cached_property

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from traces.errors import SpecError
from traces.hardware import GpuType, get_gpu
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
        return get_gpu(value).name

    @property
    def gpu(self) -> GpuType:
        gpu = get_gpu(self.gpu_type)
        if self.price_per_gpu_hour is not None:
            gpu = gpu.model_copy(update={"price_per_gpu_hour": self.price_per_gpu_hour})
        return gpu

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
    node_groups: tuple[NodeGroup, ...] = Field(min_length=1, max_length=1000)
    links: tuple[LabelLink, ...] = Field(default=(), max_length=10_000)

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
    def gpu_counts(self) -> dict[str, int]:
        """Total GPUs per type."""
        counts: Counter[str] = Counter()
        for group in self.node_groups:
            counts[group.gpu_type] += group.gpus
        return dict(counts)

    @property
    def total_gpus(self) -> int:
        return sum(self.gpu_counts.values())

    def gpu(self, gpu_type: str) -> GpuType:
        """The GPU type as priced in this cluster (a group's price override wins)."""
        for group in self.node_groups:
            if group.gpu_type == get_gpu(gpu_type).name:
                return group.gpu
        raise SpecError(f"cluster '{self.name}' has no {gpu_type} GPUs; it has {', '.join(self.gpu_counts)}")

    def groups_of(self, gpu_type: str) -> list[NodeGroup]:
        name = get_gpu(gpu_type).name
        return [g for g in self.node_groups if g.gpu_type == name]

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
