"""The plan format: which GPUs generate, which train, with what parallelism.

A plan is a JSON file with a ``schema_version``; ``Plan.from_json(p.to_json()) == p``.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, FiniteFloat, field_validator, model_validator

from traces.hardware import canonical_gpu_name
from traces.io import atomic_write_text, load_yaml, loads_json, validate
from traces.moe import attention_replicas

SCHEMA_VERSION = 1
_FROZEN = ConfigDict(frozen=True, extra="forbid")


def _canonical_gpu(value: Any) -> Any:
    """Catalog names made canonical; a cluster's own types are checked against the cluster (sim.check_plan)."""
    return canonical_gpu_name(value) if isinstance(value, str) else value


def engine_seqs(max_num_seqs: int | None, ep: int, default: int) -> int:
    """Sequences one engine accepts: max_num_seqs (else `default`, vLLM's 256) per attention replica (an EP
    engine has one per GPU: traces.moe.attention_replicas). Past what its KV cache runs at once, the rest
    wait in its queue (sim.admission); the planner's race routes to the same cap (planner.drain)."""
    return (max_num_seqs or default) * int(attention_replicas(ep))


class RolloutGroup(BaseModel):
    """`instances` inference engines of `tp` GPUs each, all of one type.

    `ep` (mixture-of-experts models): 1, or tp for experts sharded whole over the engine's GPUs with
    data-parallel attention (traces/costmodel/roofline.py).
    """

    model_config = _FROZEN

    gpu_type: str
    tp: int = Field(default=1, ge=1, le=64)
    ep: int = Field(default=1, ge=1, le=64, description="expert-parallel ranks per engine (1 or tp)")
    instances: int = Field(ge=1, le=1_000_000)
    nodes: tuple[int, ...] = Field(default=(), description="concrete node indices, if placed")
    max_num_seqs: int | None = Field(default=None, ge=1, le=65536,
                                     description="running sequences per engine, per attention replica with EP "
                                                 "(vLLM max_num_seqs); None: 256")
    enforce_eager: bool = Field(default=False, description="no CUDA graphs (vLLM enforce_eager): every decode "
                                "iteration launches its kernels (traces.costmodel.cuda_graphs)")
    cuda_graph_max_batch: int | None = Field(
        default=None, ge=1, le=65536, description="largest batch with a captured CUDA graph (vLLM "
        "max_cudagraph_capture_size); larger batches decode eagerly. None: no limit")

    _gpu = field_validator("gpu_type", mode="before")(_canonical_gpu)

    @property
    def gpus(self) -> int:
        return self.tp * self.instances


class TrainerGroup(BaseModel):
    """One trainer: dp x tp x pp GPUs of one type (ZeRO/FSDP shards across dp).

    `ep` (mixture-of-experts models): the routed experts split whole over ep of the dp x tp ranks
    (Megatron-Core expert parallelism, expert tensor parallelism 1); 1: each expert over tp.
    """

    model_config = _FROZEN

    gpu_type: str
    dp: int = Field(default=1, ge=1, le=1_000_000)
    tp: int = Field(default=1, ge=1, le=64)
    pp: int = Field(default=1, ge=1, le=1024)
    ep: int = Field(default=1, ge=1, le=1_000_000, description="expert-parallel ranks (divides dp x tp)")
    zero_stage: Literal[0, 1, 2, 3] = 3
    recompute: Literal["none", "selective", "full"] = "selective"
    nodes: tuple[int, ...] = ()

    _gpu = field_validator("gpu_type", mode="before")(_canonical_gpu)

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp


class Offload(BaseModel):
    """What a colocated plan moves off the GPUs at each hand-over (the default: everything).

    The trainer's weights, gradients and optimizer states each go to host memory while the engine
    generates, or stay in HBM, shrinking its KV cache (verl's actor param_offload / grad_offload /
    optimizer_offload). The engine sleeps while the trainer runs at vLLM's `engine_sleep` level:
    1 moves its weights to the host, 2 discards them (the weight sync refills them), 0 stays
    resident with its KV cache, leaving the trainer the rest of the GPU.
    """

    model_config = _FROZEN

    params: bool = True
    grads: bool = True
    optimizer: bool = True
    engine_sleep: Literal[0, 1, 2] = 1

    @property
    def trainer_parts(self) -> tuple[bool, bool, bool]:
        """(weights, gradients, optimizer states) moved to the host."""
        return self.params, self.grads, self.optimizer


class Plan(BaseModel):
    model_config = _FROZEN

    schema_version: int = SCHEMA_VERSION
    cluster: str = ""
    workload: str = ""
    model: str = ""
    mode: Literal["async", "sync", "colocated"] = "async"
    staleness: int | float = Field(default=0, ge=0, le=1000,
                                   description="eta; a fraction is part of a batch (traces.staleness)")
    rollout: tuple[RolloutGroup, ...] = Field(min_length=1, max_length=1000)
    trainer: TrainerGroup
    max_concurrent_rollouts: int | None = Field(default=None, ge=1, le=100_000_000)
    offload: Offload = Field(default_factory=Offload, description="colocated hand-overs: what moves to the host")
    predicted: dict[str, FiniteFloat] = Field(default_factory=dict)  # NaN would make the plan invalid JSON

    @model_validator(mode="after")
    def _check(self) -> Plan:
        if self.schema_version != SCHEMA_VERSION:
            raise ValueError(
                f"schema_version {self.schema_version} is not supported (this rlfleet reads {SCHEMA_VERSION})"
            )
        if self.mode != "async" and self.staleness > 0:
            raise ValueError(f"staleness {self.staleness} contradicts mode '{self.mode}'; set 0 or use async")
        if self.mode != "colocated" and self.offload != Offload():
            raise ValueError(f"offload applies to colocated hand-overs, but the plan is {self.mode}: remove offload "
                             "or use mode colocated")
        return self

    @property
    def gpus_by_type(self) -> dict[str, dict[str, int]]:
        """{gpu_type: {"rollout": n, "train": n}} by role (a colocated plan's GPUs appear in both)."""
        out: dict[str, dict[str, int]] = {}
        for group in self.rollout:
            out.setdefault(group.gpu_type, {"rollout": 0, "train": 0})["rollout"] += group.gpus
        out.setdefault(self.trainer.gpu_type, {"rollout": 0, "train": 0})["train"] += self.trainer.gpus
        return out

    @property
    def gpus_in_use(self) -> dict[str, int]:
        """{gpu_type: GPUs occupied}; a colocated plan's shared GPUs count once."""
        if self.mode == "colocated":
            return {self.trainer.gpu_type: self.trainer.gpus}
        return {t: roles["rollout"] + roles["train"] for t, roles in self.gpus_by_type.items()}

    def running_cap(self, group: RolloutGroup, default: int) -> int:
        """Running sequences per engine of `group`: its max_num_seqs (else `default`, vLLM's 256) per
        attention replica (an EP engine has one per GPU: traces.moe.attention_replicas), and no more
        than its share of max_concurrent_rollouts spread evenly over every engine (simulator and runtime)."""
        cap = engine_seqs(group.max_num_seqs, group.ep, default)
        if self.max_concurrent_rollouts is not None:
            engines = sum(g.instances for g in self.rollout)
            cap = min(cap, math.ceil(self.max_concurrent_rollouts / engines))
        return cap

    @property
    def total_gpus(self) -> int:
        return sum(self.gpus_in_use.values())

    def to_frame(self) -> Any:
        """One row per group: role, GPU type, parallelism (EP included), GPUs and nodes (a pandas DataFrame)."""
        import pandas as pd

        t = self.trainer
        rows = [{"role": "rollout", "gpu_type": g.gpu_type, "instances": g.instances, "tp": g.tp, "dp": None,
                 "pp": None, "ep": g.ep, "gpus": g.gpus, "nodes": _span(g.nodes)} for g in self.rollout]
        rows.append({"role": "train", "gpu_type": t.gpu_type, "instances": 1, "tp": t.tp, "dp": t.dp, "pp": t.pp,
                     "ep": t.ep, "gpus": t.gpus, "nodes": _span(t.nodes)})
        return pd.DataFrame(rows).astype({"dp": "Int64", "pp": "Int64"})

    def summary(self) -> dict[str, Any]:
        return {"mode": self.mode, "staleness": self.staleness, "gpus": self.gpus_by_type,
                "total_gpus": self.total_gpus, "predicted": dict(self.predicted)}

    def _repr_html_(self) -> str:
        head = f"<b>{self.mode} plan</b>" + (f", staleness {self.staleness}" if self.mode == "async" else "")
        predicted = "".join(f"<li>{k}: {v:,.4g}</li>" for k, v in self.predicted.items())
        return head + self.to_frame().to_html(index=False, na_rep="") + (f"<ul>{predicted}</ul>" if predicted else "")

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=2, sort_keys=False) + "\n"

    @classmethod
    def from_json(cls, text: str, origin: str = "plan") -> Plan:
        return validate(cls, loads_json(text, origin), origin)

    def save(self, path: str | os.PathLike[str]) -> None:
        atomic_write_text(path, self.to_json())


def _span(nodes: tuple[int, ...]) -> str:
    if not nodes:
        return ""
    return str(nodes[0]) if len(nodes) == 1 else f"{nodes[0]}-{nodes[-1]}"


def load_plan(path: str | os.PathLike[str]) -> Plan:
    data = load_yaml(path)  # JSON is YAML; this gives the same file/line errors
    return validate(Plan, data, str(path))
