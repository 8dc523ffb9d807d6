"""The cost model: one interface over profiled tables and the roofline.

A profiled table wins where it has data; outside its range the roofline is scaled to the
nearest measured point; elsewhere the roofline answers. Every estimate carries its source.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike

from traces.costmodel import roofline as rf
from traces.costmodel.cuda_graphs import eager_overhead_seconds
from traces.costmodel.efficiency import DEFAULT_EFFICIENCY, Efficiency
from traces.costmodel.tables import KEYS, ProfileTable
from traces.hardware import GpuType
from traces.lora import table_name
from traces.models import ModelSpec
from traces.moe import attention_replicas

ROOFLINE, PROFILE, SCALED = "roofline", "profile", "profile-scaled"


@dataclass(frozen=True)
class Estimate:
    """Seconds per query (an array, 0-d for scalar queries) and where each figure came from."""

    seconds: np.ndarray
    source: np.ndarray

    def __float__(self) -> float:
        return float(self.seconds)

    @property
    def sources(self) -> set[str]:
        return set(np.atleast_1d(self.source).tolist())


@dataclass(frozen=True)
class GenerationRate:
    """Steady-state output of one rollout engine under a workload's length mix."""

    samples_per_s: np.ndarray
    tokens_per_s: np.ndarray  # generated tokens
    batch: np.ndarray  # running sequences the KV cache allows
    iteration_s: np.ndarray
    source: np.ndarray


@dataclass(frozen=True)
class CostModel:
    tables: ProfileTable = field(default_factory=ProfileTable.shipped)
    efficiency: Efficiency = DEFAULT_EFFICIENCY

    @classmethod
    def roofline_only(cls, efficiency: Efficiency = DEFAULT_EFFICIENCY) -> CostModel:
        return cls(ProfileTable.empty(), efficiency)

    # ---- the stages --------------------------------------------------------------------
    def decode(self, gpu: GpuType, model: ModelSpec, tp: ArrayLike, batch: ArrayLike, context: ArrayLike,
               ep: ArrayLike = 1, *, enforce_eager: bool = False, graph_max_batch: int | None = None) -> Estimate:
        """Seconds of one decode iteration: `batch` sequences at mean context `context` (ep: see roofline);
        an eager engine (or a batch above its largest CUDA graph) adds its kernel launches (cuda_graphs)."""
        eff = self.efficiency
        est = self._blend(
            "decode", gpu, model, {"tp": tp, "ep": ep}, {"batch": batch, "context": context},
            lambda k, a: rf.decode_seconds(gpu, model, k["tp"], a["batch"], a["context"], eff, k["ep"]),
        )
        if not enforce_eager and graph_max_batch is None:
            return est
        extra = eager_overhead_seconds(model, batch, enforce_eager=enforce_eager, graph_max_batch=graph_max_batch)
        return Estimate(est.seconds + extra, est.source)

    def prefill(
        self, gpu: GpuType, model: ModelSpec, tp: ArrayLike, tokens: ArrayLike, context: ArrayLike | None = None,
        ep: ArrayLike = 1, prefix: ArrayLike = 0.0,
    ) -> Estimate:
        """Seconds to prefill `tokens` tokens of sequences `context` long (default: one sequence), each
        after `prefix` tokens whose KV is cached (a prefix-cache hit: roofline.prefill_seconds)."""
        eff = self.efficiency
        ctx = tokens if context is None else context
        est = self._blend(
            "prefill", gpu, model, {"tp": tp, "ep": ep}, {"tokens": tokens},
            lambda k, a: rf.prefill_seconds(gpu, model, k["tp"], a["tokens"], np.minimum(ctx, a["tokens"]), eff,
                                            k["ep"]),
        )
        if not np.any(np.asarray(prefix, float) > 0):
            return est
        # measured prefill rows have no cached prefix: the roofline's extra for it goes on top
        def roof(k: ArrayLike) -> np.ndarray:
            return rf.prefill_seconds(gpu, model, tp, tokens, np.minimum(ctx, tokens), eff, ep, k)
        return Estimate(est.seconds + roof(prefix) - roof(0.0), est.source)

    def train(
        self, gpu: GpuType, model: ModelSpec, dp: ArrayLike, tp: ArrayLike, pp: ArrayLike, tokens: ArrayLike,
        *, seq_len: ArrayLike = 4096, microbatch_tokens: ArrayLike | None = None, zero_stage: int = 3,
        recompute: str = "selective", virtual_stages: int = 1, gpus_per_node: int = 8,
        inter_node_bytes_per_s: float = 50e9, ep: ArrayLike = 1, last_stage_layers: ArrayLike | None = None,
        lora_rank: int = 0, kernels: str = "fused",
    ) -> Estimate:
        """Seconds of one optimizer step over `tokens` tokens (sequences `seq_len` long).

        `last_stage_layers`: decoder layers on the last pipeline rank, which also holds the LM head and
        the loss (None: layers / pp, Megatron's even split; fewer where the split accounts for the
        loss, e.g. Megatron's --account-for-loss-in-pipeline-split): roofline.train_seconds.
        `lora_rank` > 0: a LoRA adapter trains, the base is frozen (traces.lora); measured rows of it
        are filed under their own model name (traces.lora.table_name), apart from full fine-tuning.
        `kernels`: 'eager' for trainers that run the model op by op (costmodel.elementwise)."""
        return self._train_like("train", gpu, model, dp, tp, pp, tokens, seq_len, microbatch_tokens,
                                zero_stage, recompute, virtual_stages, gpus_per_node, inter_node_bytes_per_s, ep,
                                last_stage_layers, lora_rank, kernels)

    def logprob(
        self, gpu: GpuType, model: ModelSpec, dp: ArrayLike, tp: ArrayLike, pp: ArrayLike, tokens: ArrayLike,
        *, seq_len: ArrayLike = 4096, microbatch_tokens: ArrayLike | None = None, zero_stage: int = 3,
        gpus_per_node: int = 8, inter_node_bytes_per_s: float = 50e9, ep: ArrayLike = 1,
        last_stage_layers: ArrayLike | None = None, kernels: str = "fused", lora_rank: int = 0,
    ) -> Estimate:
        """Seconds of the forward-only logprob recompute pass over `tokens` tokens; `lora_rank` > 0: of
        the adapted policy (the reference pass of a LoRA job is the base's, lora_rank 0)."""
        return self._train_like("logprob", gpu, model, dp, tp, pp, tokens, seq_len, microbatch_tokens,
                                zero_stage, "none", 1, gpus_per_node, inter_node_bytes_per_s, ep, last_stage_layers,
                                lora_rank, kernels)

    def sync(self, trainer_gpu: GpuType, model: ModelSpec, engines: ArrayLike, path_bytes_per_s: ArrayLike,
             lora_rank: int = 0) -> Estimate:
        """Seconds to push new weights from trainer rank 0 to `engines` engines over the path (a LoRA
        adapter alone when `lora_rank` > 0, measured under its own name: traces.lora.table_name)."""
        eff = self.efficiency
        return self._blend(
            "sync", trainer_gpu, model, {}, {"batch": engines},
            lambda k, a: rf.sync_seconds(model, a["batch"], path_bytes_per_s, eff, lora_rank),
            table_model=table_name(model, lora_rank),
        )

    def colocate_switch(
        self, gpu: GpuType, model: ModelSpec, engine_tp: ArrayLike, dp: ArrayLike, tp: ArrayLike, pp: ArrayLike,
        *, zero_stage: int = 3, ep: ArrayLike = 1, offload: tuple[bool, bool, bool] = (True, True, True),
        engine_sleep: int = 1, lora_rank: int = 0,
    ) -> Estimate:
        """Seconds of one hand-over of colocated GPUs between engine and trainer (roofline only):
        `offload` says which of the trainer's weights, gradients, optimizer states move to the host,
        `engine_sleep` is vLLM's sleep level (roofline.colocate_switch_seconds)."""
        secs = np.asarray(rf.colocate_switch_seconds(gpu, model, engine_tp, dp, tp, pp, self.efficiency,
                                                     zero_stage=zero_stage, ep=ep, offload=offload,
                                                     engine_sleep=engine_sleep, lora_rank=lora_rank), float)
        return Estimate(secs, np.full(secs.shape, ROOFLINE, dtype=object))

    # ---- memory ------------------------------------------------------------------------
    def kv_capacity_tokens(self, gpu: GpuType, model: ModelSpec, tp: ArrayLike, ep: ArrayLike = 1,
                           resident_bytes: float = 0.0) -> np.ndarray:
        """KV tokens an engine holds; `resident_bytes` per GPU are a colocated trainer's states, which
        shrink the engine's share of HBM only where they leave less than that share free."""
        return rf.kv_capacity_tokens(gpu, model, tp, self.efficiency, ep, resident_bytes)

    def max_batch(self, gpu: GpuType, model: ModelSpec, tp: ArrayLike, context: ArrayLike,
                  ep: ArrayLike = 1) -> np.ndarray:
        """Sequences of `context` tokens an engine can run at once (0: not even one fits); max_num_seqs
        caps each attention replica (an EP engine has one per GPU: traces.moe.attention_replicas)."""
        cap = np.floor(self.kv_capacity_tokens(gpu, model, tp, ep) / np.maximum(np.asarray(context, float), 1))
        return np.minimum(cap, self.efficiency.max_num_seqs * attention_replicas(ep)).astype(np.int64)

    def train_memory_bytes(
        self, gpu: GpuType, model: ModelSpec, dp: ArrayLike, tp: ArrayLike, pp: ArrayLike, *,
        microbatch_tokens: ArrayLike = 4096, seq_len: ArrayLike = 4096, zero_stage: int = 3,
        recompute: str = "selective", ep: ArrayLike = 1, lora_rank: int = 0,
    ) -> np.ndarray:
        return rf.train_memory_bytes(gpu, model, dp, tp, pp, self.efficiency, microbatch_tokens=microbatch_tokens,
                                     seq_len=seq_len, zero_stage=zero_stage, recompute=recompute, ep=ep,
                                     lora_rank=lora_rank)

    def train_fits(
        self, gpu: GpuType, model: ModelSpec, dp: ArrayLike, tp: ArrayLike, pp: ArrayLike, **kw: object
    ) -> np.ndarray:
        return self.train_memory_bytes(gpu, model, dp, tp, pp, **kw) <= gpu.hbm_bytes  # type: ignore[arg-type]

    # ---- composite ---------------------------------------------------------------------
    def generation_rate(
        self, gpu: GpuType, model: ModelSpec, tp: ArrayLike, *, prompt_mean: float, response_mean: float,
        response_sq_mean: float | None = None, max_num_seqs: ArrayLike | None = None, ep: ArrayLike = 1,
    ) -> GenerationRate:
        """Steady-state samples/s of one engine under continuous batching.

        A running sequence holds prompt + generated-so-far tokens; weighting by the iterations each
        sequence occupies, the mean context is E[p] + E[o^2] / (2 E[o]). The batch is what the KV
        cache holds at that context (capped by max_num_seqs). Each sample costs its share of a
        prefill chunk plus o / B decode iterations.
        """
        sq = response_sq_mean if response_sq_mean is not None else response_mean**2
        context = prompt_mean + sq / (2 * response_mean)
        batch = self.max_batch(gpu, model, tp, context, ep)
        if max_num_seqs is not None:
            batch = np.minimum(batch, max_num_seqs)
        b = np.maximum(batch, 1)
        it = self.decode(gpu, model, tp, b, context, ep)
        per_chunk = max(1, int(self.efficiency.prefill_chunk_tokens // max(prompt_mean, 1)))
        pre = self.prefill(gpu, model, tp, prompt_mean * per_chunk, prompt_mean, ep)
        per_sample = pre.seconds / per_chunk + response_mean * it.seconds / b
        samples = np.where(batch > 0, 1.0 / per_sample, 0.0)
        return GenerationRate(samples, samples * response_mean, batch, it.seconds, it.source)

    # ---- internals ---------------------------------------------------------------------
    def _train_like(
        self, stage: str, gpu: GpuType, model: ModelSpec, dp: ArrayLike, tp: ArrayLike, pp: ArrayLike,
        tokens: ArrayLike, seq_len: ArrayLike, microbatch_tokens: ArrayLike | None, zero_stage: int,
        recompute: str, virtual_stages: int, gpus_per_node: int, inter_node: float, ep: ArrayLike,
        last_stage_layers: ArrayLike | None = None, lora_rank: int = 0, kernels: str = "fused",
    ) -> Estimate:
        eff = self.efficiency
        mb = seq_len if microbatch_tokens is None else microbatch_tokens

        def roof(k: dict[str, np.ndarray], a: dict[str, np.ndarray]) -> np.ndarray:
            return rf.train_seconds(
                gpu, model, k["dp"], k["tp"], k["pp"], a["tokens"], eff, seq_len=seq_len, microbatch_tokens=mb,
                zero_stage=zero_stage, recompute=recompute, virtual_stages=virtual_stages,
                gpus_per_node=gpus_per_node, inter_node_bytes_per_s=inter_node, forward_only=stage == "logprob",
                ep=k["ep"], last_stage_layers=last_stage_layers, lora_rank=lora_rank, kernels=kernels,
            )

        # a LoRA step is measured apart from full fine-tuning of the same model (traces.lora.table_name);
        # measured rows are the trainer's own: its kernels are in them, so they price either kind alike
        return self._blend(stage, gpu, model, {"dp": dp, "tp": tp, "pp": pp, "ep": ep}, {"tokens": tokens}, roof,
                           table_model=table_name(model, lora_rank))

    def _blend(
        self, stage: str, gpu: GpuType, model: ModelSpec, keys: dict[str, ArrayLike], axes: dict[str, ArrayLike],
        roofline: Callable[[dict[str, np.ndarray], dict[str, np.ndarray]], np.ndarray], table_model: str = "",
    ) -> Estimate:
        arrays = np.broadcast_arrays(*[np.asarray(v, float) for v in (*keys.values(), *axes.values())])
        k = dict(zip(keys, arrays[: len(keys)], strict=True))
        a = dict(zip(axes, arrays[len(keys):], strict=True))
        shape = arrays[0].shape if arrays else ()
        seconds = np.array(np.broadcast_to(np.asarray(roofline(k, a), float), shape))
        source = np.full(seconds.shape, ROOFLINE, dtype=object)
        rows = self.tables.rows(stage, gpu.name, table_model or model.name) if len(self.tables) else None
        if rows is None or rows.empty:
            return Estimate(seconds, source)
        key_names = KEYS[stage]
        combos: list[tuple[float, ...]] = [()]
        if key_names:
            stacked = np.stack([k[n].ravel() for n in key_names], axis=1)
            combos = [tuple(row) for row in np.unique(stacked, axis=0)]
        for combo in combos:
            # measured rows have no expert-parallel column: they price ep = 1 layouts only
            mask = k["ep"] <= 1 if "ep" in k else np.ones(seconds.shape, bool)
            sub = rows
            for name, value in zip(key_names, combo, strict=True):
                mask &= k[name] == value
                sub = sub[sub[name] == value]
            if sub.empty or not mask.any():
                continue
            found = self.tables.lookup(sub, stage, {n: a[n][mask] for n in a})
            inside = ~np.isnan(found.seconds)
            sel_k = {n: k[n][mask] for n in k}
            # Outside the table: the roofline, scaled by measured/roofline at the nearest row.
            at_nearest = np.asarray(roofline(sel_k, found.nearest_axes), float)
            scaled = seconds[mask] * found.nearest_seconds / at_nearest
            seconds[mask] = np.where(inside, found.seconds, scaled)
            source[mask] = np.where(inside, PROFILE, SCALED)
        return Estimate(seconds, source)
