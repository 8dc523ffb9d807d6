"""Per-step costs of an RL trainer, shared by the simulator and the planner.

One trainer step over a batch: the proximal policy's logprobs (unless the engines returned them:
`rollout_logprobs`), the reference policy's where the loss has a KL term, then `ppo_minibatches`
optimizer steps over equal slices of the batch, each in micro-batches of `Workload.microbatch_tokens`
tokens; a LoRA job (`lora_rank`) trains its adapter alone; an eager trainer (`trainer_kernels`) streams
HBM between its GEMMs (costmodel.elementwise). A streaming trainer
(`Workload.stream_chunks`) runs this over each chunk with its share of the minibatches.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
from numpy.typing import ArrayLike

from traces.costmodel.model import CostModel
from traces.costmodel.roofline import train_state_parts
from traces.hardware import GpuType
from traces.plan import Offload, TrainerGroup
from traces.workload import Workload


def trainer_step_seconds(
    cm: CostModel, gpu: GpuType, workload: Workload, dp: ArrayLike, tp: ArrayLike, pp: ArrayLike, tokens: ArrayLike,
    *, zero_stage: int, recompute: str, gpus_per_node: int, inter_node_bytes_per_s: float, ep: ArrayLike = 1,
    minibatches: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(logprob seconds, train seconds) of one step over `tokens` tokens (or of one streaming chunk
    of `minibatches` optimizer steps); vectorised over configs."""
    kw = {"seq_len": workload.mean_tokens_per_sample, "microbatch_tokens": workload.microbatch_tokens,
          "zero_stage": zero_stage, "gpus_per_node": gpus_per_node, "inter_node_bytes_per_s": inter_node_bytes_per_s,
          "ep": ep, "kernels": workload.trainer_kernels}
    # the old policy's logprobs (recomputed unless the engines returned them), with its LoRA adapter if
    # it trains one, and the reference's: the base model alone; passes of the same model are priced once
    ranks = ([] if workload.rollout_logprobs else [workload.lora_rank]) + ([0] if workload.kl_reference else [])
    logprob = np.zeros(np.broadcast(*(np.asarray(x) for x in (dp, tp, pp, ep, tokens))).shape)
    for rank, passes in Counter(ranks).items():
        logprob = logprob + passes * cm.logprob(gpu, workload.model, dp, tp, pp, tokens, lora_rank=rank, **kw).seconds
    m = workload.ppo_minibatches if minibatches is None else minibatches
    train = m * cm.train(gpu, workload.model, dp, tp, pp, np.asarray(tokens, float) / m, recompute=recompute,
                         lora_rank=workload.lora_rank, **kw).seconds
    return logprob, train


def trainer_fits(
    cm: CostModel, gpu: GpuType, workload: Workload, dp: ArrayLike, tp: ArrayLike, pp: ArrayLike,
    *, zero_stage: int, recompute: str, ep: ArrayLike = 1,
) -> np.ndarray:
    """Whether the trainer's weights, optimizer states and one micro-batch fit in HBM."""
    return cm.train_fits(gpu, workload.model, dp, tp, pp, microbatch_tokens=workload.microbatch_tokens,
                         seq_len=workload.mean_tokens_per_sample, zero_stage=zero_stage, recompute=recompute, ep=ep,
                         lora_rank=workload.lora_rank)


def colocated_resident_bytes(workload: Workload, trainer: TrainerGroup, offload: Offload) -> float:
    """Bytes per GPU of the trainer's states a colocated plan keeps in HBM while the engine runs
    (those `offload` does not move to the host): the engine's share of HBM is at most what they leave
    free (roofline.kv_capacity_tokens)."""
    parts = train_state_parts(workload.model, trainer.dp, trainer.tp, trainer.pp, zero_stage=trainer.zero_stage,
                              ep=trainer.ep, lora_rank=workload.lora_rank)
    return float(sum(float(part) for part, moved in zip(parts, offload.trainer_parts, strict=True) if not moved))


def colocated_trainer_fits(cm: CostModel, gpu: GpuType, workload: Workload, trainer: TrainerGroup,
                           offload: Offload) -> bool:
    """Whether the trainer fits next to an engine that does not sleep (engine_sleep 0), which keeps
    its share of HBM (Efficiency.engine_memory_fraction, vLLM's gpu_memory_utilization) throughout."""
    engine = gpu.hbm_bytes * cm.efficiency.engine_memory_fraction if offload.engine_sleep == 0 else 0.0
    need = cm.train_memory_bytes(gpu, workload.model, trainer.dp, trainer.tp, trainer.pp,
                                 microbatch_tokens=workload.microbatch_tokens, seq_len=workload.mean_tokens_per_sample,
                                 zero_stage=trainer.zero_stage, recompute=trainer.recompute, ep=trainer.ep,
                                 lora_rank=workload.lora_rank)
    return bool(float(need) + engine <= gpu.hbm_bytes)
