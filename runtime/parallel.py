"""Data-parallel trainer ranks (each of dp processes holds a replica; DDP averages the gradients), composed
with tensor parallelism over a (dp, tp) mesh.

The contract: a dp=k step on a batch gives the weights and `StepStats` of a dp=1 `Trainer` step on the
same batch (up to float summation order). How:
- every rank is handed the *global* batch (from Ray, one object read by all ranks: rollouts are token
  lists, small beside the weights). Advantages, rewards, token counts and version lags are computed
  from it on every rank, so they are global without any communication;
- each rank trains on whole GRPO groups: groups in order of first appearance, cut into dp equal
  contiguous blocks (`shard_rows`); a batch whose group count is not a multiple of dp is refused;
- minibatches are the dp=1 trainer's: the same seeded permutation of the global rows, cut the same way
  (`minibatch_rows`). Each rank takes the rows of each global minibatch that it holds, possibly none;
- the loss of a global minibatch is a token-mean over all its response tokens. A rank's objective is
  its own token-sum divided by the minibatch's *global* token count (known from the global batch),
  times the world size, because DDP averages gradients over ranks: the average of k such gradients
  is the gradient of the global token-mean. Gradients after DDP's all-reduce are global and identical
  on every rank, so grad-norm clipping uses the global norm, and Adam's updates stay identical;
- a rank with no rows in a minibatch still runs a forward and backward (on one of its rows, every token
  masked): DDP's all-reduce needs every rank, and a zero gradient is that rank's share;
- loss statistics are summed over ranks in one all-reduce at the end of the step, so every rank (and
  rank 0, which the driver reads) returns the global `StepStats`.

Wrappers: `wrap="ddp"` (a full replica per rank) or `wrap="fsdp"` (FSDP2's `fully_shard`: parameters,
gradients and Adam state sharded over the ranks; it too averages gradients over ranks, so the same
normalisation holds). Under fsdp, `weights()` all-gathers, so every rank must call it together, and
checkpoints are refused (they need torch.distributed.checkpoint, not wired).

Tensor parallelism (`tp` > 1, runtime.tensor_parallel): the dp * tp ranks form a (dp, tp) mesh. A rank's
rows are those of its dp coordinate (the tp ranks of one dp group train the same rows), and it holds 1/tp
of the attention heads and MLP columns. The loss is scaled by dp, as above; the gradients are averaged over
the dp group here (DDP wraps plain-tensor parameters; its DTensor composition is a private torch hook) and
the statistics summed over it. A tp step's weights and `StepStats` equal the tp=1 `Trainer`'s within float
summation order; grad-norm clipping takes the global norm over the shards (`clip_grad_norm`).

Process group: torch's default group (`init_dp_group`), separate from runtime.sync's weight-sync group,
which is a `ProcessGroupGloo` of its own. Device and backend: CUDA and NCCL where a GPU exists (Ray gives
each trainer actor one GPU, which it sees as device 0), CPU and gloo otherwise. Only the CPU/gloo path is
tested here; the CUDA/NCCL path is wired the same way but untested on this machine.
"""

from __future__ import annotations

import datetime
import os
import time
import zlib
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from transformers import PreTrainedModel

from runtime.run_plan import pp_refusal
from runtime.sync import SyncGroup
from runtime.tensor_parallel import (
    average_gradients,
    check_tp,
    clip_grad_norm,
    full,
    mesh_for,
    shard_like,
    tensor_parallelize,
)
from runtime.trainer import (
    Packed,
    Rollout,
    StepStats,
    TrainConfig,
    Trainer,
    decoupled_ppo_loss,
    grpo_advantages,
    logprobs_and_entropy,
    minibatch_rows,
    pack,
    read_trainer_file,
    write_trainer_file,
)
from traces.errors import SpecError

__all__ = ["DataParallelTrainer", "Wrap", "backend_for", "check_dp", "check_pp", "check_trainer_shape",
           "default_device", "host_dp_store", "init_dp_group", "minibatch_rows", "shard_rows", "step_fingerprint"]

# ddp: a full replica per rank, gradients all-reduced. fsdp: FSDP2's fully_shard, parameters, gradients and
# Adam state sharded over the ranks (memory / dp), weights all-gathered for each forward
Wrap = Literal["ddp", "fsdp"]


def default_device() -> torch.device:
    """cuda:0 where a GPU is visible (a Ray actor with one GPU sees it as device 0), the CPU otherwise."""
    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


def backend_for(device: torch.device) -> str:
    """NCCL for CUDA tensors, gloo for CPU tensors: each backend only moves tensors of its device."""
    return "nccl" if device.type == "cuda" else "gloo"


host_dp_store = SyncGroup.host_store  # the data-parallel group's store: rank 0's, as the sync group's


def init_dp_group(rank: int, world_size: int, host: str = "127.0.0.1", port: int = 0,
                  device: torch.device | None = None, store: dist.Store | None = None,
                  timeout_s: float = 300.0) -> None:
    """Join torch's default process group as data-parallel rank `rank`; blocks until all ranks joined.

    Pass `store` in the process that hosts it (`host_dp_store`), `host` and `port` everywhere else.
    """
    if dist.is_initialized():
        raise RuntimeError("this process already has a default process group; one trainer rank per process")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside a data-parallel group of {world_size}")
    timeout = datetime.timedelta(seconds=timeout_s)
    if store is None:
        store = dist.TCPStore(host, port, world_size, is_master=False, timeout=timeout)
    backend = backend_for(device or default_device())
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)


def shard_rows(groups: Sequence[int], rank: int, world_size: int) -> tuple[int, ...]:
    """Indices of the rows of `rank`'s GRPO groups: groups in order of first appearance, in dp equal blocks.

    Whole groups, so a rank's rows keep their group mates (what a per-rank advantage would need), and equal
    group counts, so ranks get even work when groups are of one size (the usual n samples per prompt).
    """
    order = list(dict.fromkeys(groups))
    if not order:
        raise ValueError("an empty batch cannot be trained")
    if len(order) % world_size:
        raise ValueError(f"the batch has {len(order)} GRPO groups, which dp={world_size} ranks cannot share "
                         f"equally: a data-parallel batch must hold a multiple of {world_size} groups")
    per_rank = len(order) // world_size
    mine = set(order[rank * per_rank:(rank + 1) * per_rank])
    return tuple(i for i, g in enumerate(groups) if g in mine)


def check_dp(dp: int, prompts_per_step: int) -> None:
    """SpecError unless dp ranks can share a step's GRPO groups (one per prompt) equally (shard_rows's rule),
    said before any actor starts."""
    if dp < 1 or prompts_per_step % dp:
        raise SpecError(f"trainer dp={dp} cannot share a step's {prompts_per_step} GRPO groups equally; "
                        f"use a dp that divides {prompts_per_step}")


def check_pp(pp: int) -> None:
    """SpecError unless pp is 1 (pp_refusal)."""
    if (why := pp_refusal(pp)) is not None:
        raise SpecError(why)


def check_trainer_shape(dp: int, tp: int, pp: int, prompts_per_step: int, heads: int, kv_heads: int,
                        intermediate: int) -> None:
    """SpecError, before any actor starts, unless the runtime can train a trainer of this shape: dp ranks
    that share the step's groups (`check_dp`), a tp that splits the model (`check_tp`), and pp 1."""
    check_pp(pp)
    check_dp(dp, prompts_per_step)
    check_tp(tp, heads, kv_heads, intermediate)


def step_fingerprint(rollouts: Sequence[Rollout], seed: int, version: int, config: TrainConfig) -> int:
    """A cheap digest of what decides a step's split and minibatches (the batch's groups, rewards, lengths
    and versions; the seed, version and config): the ranks must agree on it."""
    batch = [(r.group, r.reward, len(r.prompt), len(r.tokens), r.versions) for r in rollouts]
    return zlib.crc32(repr((seed, version, config, batch)).encode())


def _fully_shard(model: torch.nn.Module, device: torch.device, world_size: int) -> None:
    """FSDP2 in place: each block Hugging Face says not to split (the decoder layers) is a unit, the rest
    (embeddings, tied head, final norm) is the root's; parameters are sharded over the dp ranks."""
    # imported here: fully_shard is public from torch 2.6, and the ddp path needs none of it
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (world_size,))
    blocks = set(getattr(model, "_no_split_modules", None) or ())
    for module in model.modules():
        if module is not model and type(module).__name__ in blocks:
            fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)


class DataParallelTrainer(Trainer):
    """One trainer rank of a dp x tp mesh; `train_step` takes the global batch on every rank.

    Construct it after `init_dp_group` (dp * tp ranks), on every rank, with the same model, config and seed
    (rank 0's weights are broadcast at construction), and call `train_step` on every rank with the same
    batch. With ddp and tp = 1, `model`, `weights()` and checkpoints are the plain `Trainer`'s (unwrapped, the
    same state-dict keys), so weight sync and checkpoint writes run on rank 0 alone; on resume every rank
    loads the same file. With tp > 1 (runtime.tensor_parallel), `weights()` and `save_checkpoint` are
    collectives (every rank calls them; rank 0 writes the file, in the plain Trainer's layout, whole tensors)
    and `load_checkpoint` cuts each rank's shards from that one file. With fsdp, `weights()` is a collective
    and checkpoints are refused.
    """

    def __init__(self, model: PreTrainedModel, pad_id: int, config: TrainConfig | None = None, seed: int = 0,
                 clock: Callable[[], float] = time.perf_counter, device: torch.device | None = None,
                 wrap: Wrap = "ddp", tp: int = 1) -> None:
        if not dist.is_initialized():
            raise RuntimeError("join the data-parallel process group (init_dp_group) before building a rank")
        if wrap not in ("ddp", "fsdp"):
            raise ValueError(f"wrap must be 'ddp' or 'fsdp', not {wrap!r}")
        if tp > 1 and wrap == "fsdp":
            raise ValueError("tp > 1 composes with wrap='ddp' (gradients averaged over dp); fsdp x tp is not wired")
        super().__init__(model, pad_id, config, seed, clock)
        self.rank, self.world_size, self.tp = dist.get_rank(), dist.get_world_size(), tp
        if self.world_size % tp:
            raise ValueError(f"tp={tp} does not divide the process group's {self.world_size} ranks")
        self.dp = self.world_size // tp
        self.device, self.wrap = device or default_device(), wrap
        # Module.to keeps the Parameter objects (it swaps their data), so the optimizer built above still
        # holds them; Adam has no state yet to move
        self.model.to(self.device)
        self.wrapped: torch.nn.Module = self.model  # what the training forward runs through
        # the dp coordinate picks the rows; stats and gradients are averaged over the dp group (None: all ranks)
        self.dp_rank, self._dp_group = self.rank, None
        if tp > 1:
            for tensor in self.model.state_dict().values():  # what DDP's construction does: rank 0's weights
                dist.broadcast(tensor.data, src=0)
            mesh = mesh_for(self.device, self.dp, tp)
            self.dp_rank, self._dp_group = mesh.get_local_rank("dp"), mesh.get_group("dp")
            tensor_parallelize(self.model, mesh["tp"])
            self._rebuild_optimizer()
        elif wrap == "ddp":
            # construction checks that every rank holds the same parameter shapes and broadcasts rank 0's values
            self.wrapped = DistributedDataParallel(
                self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        else:
            _fully_shard(self.model, self.device, self.world_size)
            self._rebuild_optimizer()

    def _rebuild_optimizer(self) -> None:
        # sharding replaced the parameters: the optimizer built by Trainer holds the old ones, so it is
        # rebuilt, of the same class with the same settings, over the shards
        self.optimizer = type(self.optimizer)(self.model.parameters(), **self.optimizer.defaults)

    @property
    def collective_weights(self) -> bool:
        """Whether `weights()` and `save_checkpoint` gather shards: every rank must then call them together."""
        return self.wrap == "fsdp" or self.tp > 1

    def weights(self) -> dict[str, torch.Tensor]:
        """Full weights, as the plain `Trainer` gives them (see `collective_weights`)."""
        if not self.collective_weights:
            return super().weights()
        return {k: full(v) for k, v in self.model.state_dict().items()}

    def checkpoint_state(self) -> dict[str, Any]:
        """The plain Trainer's state; with tp > 1 the shards gathered whole (a collective)."""
        state = super().checkpoint_state()
        if self.tp == 1:
            return state
        optimizer = state["optimizer"]
        moments = {i: {k: full(v) for k, v in s.items()} for i, s in optimizer["state"].items()}
        return {**state, "model": self.weights(), "optimizer": {**optimizer, "state": moments}}

    def save_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """With tp > 1 a collective (every rank calls it; rank 0 writes), else rank 0 alone calls it."""
        self._refuse_sharded_checkpoint()
        state = self.checkpoint_state()
        if self.tp == 1 or self.rank == 0:
            write_trainer_file(path, state)

    def load_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """Every rank reads the one file; with tp > 1 each cuts its shards of the weights and moments from it."""
        self._refuse_sharded_checkpoint()
        state = read_trainer_file(path)
        if self.tp > 1:
            current = self.model.state_dict()
            params = [p for g in self.optimizer.param_groups for p in g["params"]]
            moments = {i: {k: shard_like(v, params[i]) if k != "step" else v for k, v in s.items()}
                       for i, s in state["optimizer"]["state"].items()}
            state = {**state, "model": {k: shard_like(v, current[k]) for k, v in state["model"].items()},
                     "optimizer": {**state["optimizer"], "state": moments}}
        self.restore(state)

    def _refuse_sharded_checkpoint(self) -> None:
        # the base class would pickle each rank's shards as if they were whole tensors
        if self.wrap == "fsdp":
            raise NotImplementedError("checkpoints of fsdp ranks need torch.distributed.checkpoint (not wired); "
                                      "use wrap='ddp' where checkpoints are written")

    def train_step(self, rollouts: list[Rollout]) -> StepStats:
        """One step on the global batch: this rank's groups, the global minibatches, DDP-averaged gradients."""
        self._check_same_batch(rollouts)
        cfg, step = self.config, self.version
        rows = shard_rows([r.group for r in rollouts], self.dp_rank, self.dp)
        rewards = torch.tensor([r.reward for r in rollouts])
        adv = grpo_advantages(rewards, torch.tensor([r.group for r in rollouts]), cfg.adv_eps)[list(rows)]
        batch = pack([rollouts[i] for i in rows], self.pad_id).to(self.device)
        adv_tokens = adv.to(self.device)[:, None].expand_as(batch.behav)
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr_at(step)
        t0 = self.clock()
        with torch.no_grad():
            self.model.eval()  # the proximal pass is an inference, on this rank's rows only
            prox = logprobs_and_entropy(self.model, batch.ids, batch.attention, cfg.temperature)[0]
            self.model.train()
        t1 = self.clock()
        local = {g: i for i, g in enumerate(rows)}  # global row -> row of this rank's packed batch
        sizes = [len(r.tokens) for r in rollouts]  # response tokens: the mask `pack` builds has as many
        sums, totals, norms = [], [], []
        for part in minibatch_rows(len(rollouts), cfg.minibatches, self.seed, step):
            totals.append(max(sum(sizes[i] for i in part.tolist()), 1))  # as the dp=1 mean clamps at 1
            mine = [local[i] for i in part.tolist() if i in local]
            sums.append(self._minibatch(batch, prox, adv_tokens, mine, totals[-1]))
            norms.append(clip_grad_norm(list(self.model.parameters()), cfg.max_grad_norm))
            self.optimizer.step()
        self.version += 1
        self.last_intervals = (("logprob", t0, t1), ("train", t1, self.clock()))
        return self._global_stats(rollouts, rewards, step, torch.stack(sums), totals, norms)

    def _minibatch(self, batch: Packed, prox: torch.Tensor, adv_tokens: torch.Tensor, mine: list[int],
                   total: int) -> torch.Tensor:
        """Backward of this rank's share of one global minibatch (averaged over dp); its statistic sums."""
        cfg = self.config
        # no rows here: a forward on row 0 with every token masked, for a zero gradient in DDP's all-reduce
        idx = torch.tensor(mine or [0], device=self.device)
        mask = batch.response[idx] if mine else torch.zeros_like(batch.response[idx])
        logp, entropy = logprobs_and_entropy(self.wrapped, batch.ids[idx], batch.attention[idx], cfg.temperature)
        loss, stats = decoupled_ppo_loss(logp, prox[idx], batch.behav[idx], adv_tokens[idx], mask,
                                         cfg.clip_eps, cfg.behav_weight_cap)
        n = mask.sum()
        token_sum = loss * n  # the loss is a mean over this rank's tokens: back to their sum
        entropy_sum = (entropy * mask).sum()
        objective = token_sum - cfg.entropy_coef * entropy_sum if cfg.entropy_coef else token_sum
        self.optimizer.zero_grad(set_to_none=True)
        (objective * (self.dp / total)).backward()  # x dp: DDP divides the sum over the dp ranks by it
        if self.tp > 1:  # no DDP module here: the same mean over the dp ranks, taken explicitly
            average_gradients(list(self.model.parameters()), self._dp_group, self.dp)
        tokens = float(n)
        # summed over ranks at the end of the step, then divided by the minibatch's global token count
        return torch.tensor([float(token_sum.detach()), stats.clip_fraction * tokens, stats.dropped_fraction * tokens,
                             stats.mean_behav_weight * tokens, float(entropy_sum.detach())], dtype=torch.float64)

    def _global_stats(self, rollouts: list[Rollout], rewards: torch.Tensor, step: int, sums: torch.Tensor,
                      totals: list[int], norms: list[float]) -> StepStats:
        """Sum the ranks' statistic sums (one all-reduce), divide by global token counts, average minibatches."""
        sums = sums.to(self.device)
        dist.all_reduce(sums, group=self._dp_group)  # over dp only: a tp group's ranks hold the same rows
        means = (sums.cpu() / torch.tensor(totals, dtype=torch.float64)[:, None]).mean(0).tolist()
        loss, clip_fraction, dropped_fraction, mean_behav_weight, entropy = means
        lags = Counter(step - v for r in rollouts for v in r.versions)
        return StepStats(
            step=step, samples=len(rollouts), tokens=sum(len(r.tokens) for r in rollouts),
            mean_reward=float(rewards.mean()), loss=loss,
            clip_fraction=clip_fraction, dropped_fraction=dropped_fraction, mean_behav_weight=mean_behav_weight,
            grad_norm=max(norms), entropy=entropy, lags=tuple(sorted(lags.items())))

    def _check_same_batch(self, rollouts: list[Rollout]) -> None:
        """Refuse, on every rank at once, a step whose ranks were handed different batches (or hold different
        seeds, versions or configs).

        Ranks that disagreed would silently train on a batch no one sent, or wait forever in a collective
        that another rank never reaches; one all-reduce of (fingerprint, -fingerprint) under MAX gives
        every rank the same max and min, so all of them raise together.
        """
        fp = step_fingerprint(rollouts, self.seed, self.version, self.config)
        both = torch.tensor([fp, -fp], dtype=torch.int64, device=self.device)
        dist.all_reduce(both, op=dist.ReduceOp.MAX)
        if int(both[0]) != -int(both[1]):
            raise ValueError(f"data-parallel rank {self.rank} of {self.world_size}: the ranks were handed "
                             "different batches, or differ in seed, version or config; every rank must get the "
                             "same global batch")
