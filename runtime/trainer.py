"""The trainer: GRPO advantages and AReaL's decoupled PPO loss, Adam, atomic checkpoints.

Asynchronous RL trains on tokens sampled by older weights (the behaviour policy, pi_behav). AReaL's
decoupled loss separates the two roles the old policy plays in PPO:
- the trust region is taken around the *proximal* policy pi_prox: the current weights before this
  step's update, whose logprobs are recomputed here. The ratio pi_theta / pi_prox is clipped to
  [1 - eps, 1 + eps], so a step moves the policy a bounded amount however stale the data is;
- off-policyness is corrected by the importance weight pi_prox / pi_behav (constant, no gradient).
  Tokens whose weight exceeds the cap are dropped from the loss, as AReaL does: such a token says
  the policy has moved far from what sampled it, and a large weight would only add variance.
The per-token loss is -w * min(r A, clip(r) A), averaged over all response tokens of the minibatch
(token-mean). With fresh data pi_prox = pi_behav, w = 1 and this is plain PPO.
"""

from __future__ import annotations

import copy
import dataclasses
import io
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedModel

from traces.io import atomic_write_bytes


@dataclass(frozen=True)
class Rollout:
    """One trained sample: a prompt's response with what the engine recorded, and its reward."""

    prompt: tuple[int, ...]
    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]  # behaviour logprobs
    versions: tuple[int, ...]  # weight version of each token
    reward: float
    group: int  # GRPO group: the samples of one prompt share it
    generated: tuple[bool, ...] = ()  # per token, sampled by the policy; () = all (runtime.engine.Completion)


@dataclass(frozen=True)
class TrainConfig:
    lr: float = 1e-3
    # linear decay from lr to lr * lr_final_ratio over decay_steps steps (0: constant). It is a function
    # of the version, not optimizer state, so a resumed run continues the same schedule
    decay_steps: int = 0
    lr_final_ratio: float = 0.1
    clip_eps: float = 0.2
    behav_weight_cap: float | None = 5.0  # None: keep every token whatever its weight
    minibatches: int = 2
    max_grad_norm: float = 1.0
    # bonus on the policy's mean token entropy (0 in AReaL's defaults): a brake on the collapse onto one
    # answer for every prompt that RL from a random model is prone to (seen on the toy task at lr 2e-3)
    entropy_coef: float = 0.0
    temperature: float = 1.0  # must equal the engines' sampling temperature
    adv_eps: float = 1e-6


@dataclass(frozen=True)
class LossStats:
    loss: float
    clip_fraction: float  # tokens whose ratio was clipped on the side that matters
    dropped_fraction: float  # tokens dropped for a behaviour weight above the cap
    mean_behav_weight: float


@dataclass(frozen=True)
class StepStats:
    step: int
    samples: int
    tokens: int
    mean_reward: float
    loss: float
    clip_fraction: float
    dropped_fraction: float
    mean_behav_weight: float
    grad_norm: float
    entropy: float  # mean over response tokens, before each minibatch's update
    lags: tuple[tuple[int, int], ...]  # (version lag, trained tokens), lag = step - token version

    @property
    def max_lag(self) -> int:
        return max((lag for lag, _ in self.lags), default=0)


def grpo_advantages(rewards: torch.Tensor, groups: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """(r - group mean) / (group std + eps): each sample is judged against its own prompt's samples.

    A group whose rewards are all equal carries no signal and gets advantage 0. Population std
    (the group is all there is), as in the GRPO paper's formula.
    """
    _, inverse, counts = torch.unique(groups, return_inverse=True, return_counts=True)
    sums = torch.zeros(len(counts), dtype=rewards.dtype).index_add_(0, inverse, rewards)
    mean = sums / counts
    centred = rewards - mean[inverse]
    var = torch.zeros(len(counts), dtype=rewards.dtype).index_add_(0, inverse, centred**2) / counts
    return centred / (var.sqrt()[inverse] + eps)


def decoupled_ppo_loss(logprobs: torch.Tensor, prox_logprobs: torch.Tensor, behav_logprobs: torch.Tensor,
                       advantages: torch.Tensor, mask: torch.Tensor, clip_eps: float,
                       behav_weight_cap: float | None) -> tuple[torch.Tensor, LossStats]:
    """AReaL's decoupled PPO objective over [rows, tokens] tensors; `mask` marks response tokens."""
    mask = mask.bool()
    ratio = torch.exp((logprobs - prox_logprobs.detach()) * mask)  # padding: ratio 1, never inf * 0 = nan
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps) * advantages
    surrogate = torch.minimum(unclipped, clipped)
    weight = torch.exp((prox_logprobs - behav_logprobs) * mask).detach()
    keep = mask if behav_weight_cap is None else mask & (weight <= behav_weight_cap)
    per_token = -surrogate * torch.where(keep, weight, torch.zeros_like(weight))
    n = mask.sum().clamp(min=1)  # dropped tokens still count in the mean, as in AReaL
    loss = per_token.sum() / n
    stats = LossStats(
        loss=float(loss.detach()),
        clip_fraction=float(((clipped < unclipped) & mask).sum() / n),
        dropped_fraction=float((mask & ~keep).sum() / n),
        mean_behav_weight=float(weight[mask].mean()) if mask.any() else 1.0,
    )
    return loss, stats


@dataclass(frozen=True)
class Packed:
    """Rollouts as right-padded tensors; column t of the [rows, width - 1] tensors predicts ids[:, t + 1]."""

    ids: torch.Tensor
    attention: torch.Tensor
    response: torch.Tensor  # bool, the response's generated tokens only (an episode's tool results excluded)
    behav: torch.Tensor
    versions: torch.Tensor

    def to(self, device: torch.device) -> Packed:
        return Packed(*(t.to(device) for t in (self.ids, self.attention, self.response, self.behav, self.versions)))


def write_trainer_file(path: str | os.PathLike[str], state: dict[str, Any]) -> None:
    """One file, written whole or not at all (a crash leaves the old checkpoint)."""
    buf = io.BytesIO()
    torch.save(state, buf)
    atomic_write_bytes(path, buf.getvalue())


def read_trainer_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    return torch.load(path, map_location="cpu", weights_only=True)  # tensors and plain types only


def pack(rollouts: list[Rollout], pad_id: int) -> Packed:
    width = max(len(r.prompt) + len(r.tokens) for r in rollouts)
    rows = len(rollouts)
    ids = torch.full((rows, width), pad_id, dtype=torch.long)
    attention = torch.zeros(rows, width, dtype=torch.long)
    response = torch.zeros(rows, width - 1, dtype=torch.bool)
    behav = torch.zeros(rows, width - 1)
    versions = torch.zeros(rows, width - 1, dtype=torch.long)
    for i, r in enumerate(rollouts):
        seq = [*r.prompt, *r.tokens]
        ids[i, : len(seq)] = torch.tensor(seq)
        attention[i, : len(seq)] = 1
        cols = slice(len(r.prompt) - 1, len(seq) - 1)
        # tool results inside an episode are context, not actions: no loss, no staleness count
        response[i, cols] = torch.tensor(r.generated) if r.generated else True
        behav[i, cols] = torch.tensor(r.logprobs)
        versions[i, cols] = torch.tensor(r.versions)
    return Packed(ids, attention, response, behav, versions)


def token_logprobs(model: PreTrainedModel, ids: torch.Tensor, attention: torch.Tensor,
                   temperature: float = 1.0) -> torch.Tensor:
    """log pi(ids[:, t + 1] | ids[:, :t + 1]) for every t: [rows, width - 1]."""
    return logprobs_and_entropy(model, ids, attention, temperature)[0]


def minibatch_rows(rows: int, minibatches: int, seed: int, step: int) -> list[torch.Tensor]:
    """A step's minibatches of row indices: a permutation seeded by (seed, step), cut in equal parts.
    Data-parallel ranks (runtime.parallel) draw the same ones, so a dp=k step trains what dp=1 would."""
    order = torch.randperm(rows, generator=torch.Generator().manual_seed(seed * 100_003 + step))
    return list(order.chunk(min(minibatches, rows)))


def logprobs_and_entropy(model: PreTrainedModel, ids: torch.Tensor, attention: torch.Tensor,
                          temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    positions = (attention.cumsum(-1) - 1).clamp(min=0)  # same rule as the engine's left-padded rows
    logits = model(input_ids=ids, attention_mask=attention, position_ids=positions).logits[:, :-1].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    entropy = -(logp.exp() * logp).sum(-1)
    return logp.gather(-1, ids[:, 1:, None]).squeeze(-1), entropy


class Trainer:
    def __init__(self, model: PreTrainedModel, pad_id: int, config: TrainConfig | None = None, seed: int = 0,
                 clock: Callable[[], float] = time.perf_counter, device: str | torch.device = "cpu") -> None:
        # on a GPU the batch is packed on the host and moved once; weights() then hands out device
        # tensors, which the sync group must move over NCCL (runtime.sync); only the CPU has run here
        self.device = torch.device(device)
        self.model = copy.deepcopy(model).to(self.device).train()
        self.clock = clock
        # (activity, start, end) of the last step: logprob (proximal pass) and train (the updates)
        self.last_intervals: tuple[tuple[str, float, float], ...] = ()
        self.pad_id = pad_id
        self.config = config or TrainConfig()
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=self.config.lr)
        self.version = 0  # weights of version v have had v steps
        self.seed = seed

    def train_step(self, rollouts: list[Rollout]) -> StepStats:
        """One step: recompute proximal logprobs, then Adam over `minibatches` shuffled minibatches."""
        cfg = self.config
        step = self.version
        batch = pack(rollouts, self.pad_id).to(self.device)
        rewards = torch.tensor([r.reward for r in rollouts], device=self.device)
        adv = grpo_advantages(rewards, torch.tensor([r.group for r in rollouts], device=self.device), cfg.adv_eps)
        adv_tokens = adv[:, None].expand_as(batch.behav)
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr_at(step)
        t0 = self.clock()
        with torch.no_grad():
            self.model.eval()  # no dropout in the tiny Llama, but the proximal pass is an inference
            prox = token_logprobs(self.model, batch.ids, batch.attention, cfg.temperature)
            self.model.train()
        t1 = self.clock()
        losses: list[LossStats] = []
        norms: list[float] = []
        entropies: list[float] = []
        for part in minibatch_rows(len(rollouts), cfg.minibatches, self.seed, step):
            logp, entropy = logprobs_and_entropy(self.model, batch.ids[part], batch.attention[part],
                                                  cfg.temperature)
            loss, stats = decoupled_ppo_loss(logp, prox[part], batch.behav[part], adv_tokens[part],
                                             batch.response[part], cfg.clip_eps, cfg.behav_weight_cap)
            mask = batch.response[part]
            mean_entropy = (entropy * mask).sum() / mask.sum().clamp(min=1)
            entropies.append(float(mean_entropy.detach()))
            if cfg.entropy_coef:
                loss = loss - cfg.entropy_coef * mean_entropy
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            norms.append(float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)))
            self.optimizer.step()
            losses.append(stats)
        self.version += 1
        self.last_intervals = (("logprob", t0, t1), ("train", t1, self.clock()))
        lags = Counter((step - batch.versions[batch.response]).tolist())
        k = len(losses)
        return StepStats(
            step=step, samples=len(rollouts), tokens=int(batch.response.sum()), mean_reward=float(rewards.mean()),
            loss=sum(s.loss for s in losses) / k, clip_fraction=sum(s.clip_fraction for s in losses) / k,
            dropped_fraction=sum(s.dropped_fraction for s in losses) / k,
            mean_behav_weight=sum(s.mean_behav_weight for s in losses) / k, grad_norm=max(norms),
            entropy=sum(entropies) / k,
            lags=tuple(sorted(lags.items())),
        )

    def lr_at(self, step: int) -> float:
        cfg = self.config
        if cfg.decay_steps <= 0:
            return cfg.lr
        done = min(step, cfg.decay_steps) / cfg.decay_steps
        return cfg.lr * (1.0 - done * (1.0 - cfg.lr_final_ratio))

    def weights(self) -> dict[str, torch.Tensor]:
        """What engines load: detached views (engines copy on receipt)."""
        return {k: v.detach() for k, v in self.model.state_dict().items()}

    def save_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """Everything a resumed run needs to take the next step as this one would, in one file written so
        a crash leaves the old checkpoint whole (`checkpoint_state`)."""
        write_trainer_file(path, self.checkpoint_state())

    def checkpoint_state(self) -> dict[str, Any]:
        """Weights, Adam's moments and step counters, the version (the LR schedule is a function of it), the
        config (the schedule's shape) and the RNG."""
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "version": self.version, "seed": self.seed, "config": dataclasses.asdict(self.config),
                "torch_rng": torch.get_rng_state()}

    def load_checkpoint(self, path: str | os.PathLike[str]) -> None:
        self.restore(read_trainer_file(path))

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from a `checkpoint_state` (as read back from its file)."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.version, self.seed = int(state["version"]), int(state["seed"])
        if "config" in state:  # older checkpoints: keep the config this trainer was built with
            self.config = TrainConfig(**state["config"])
        if "torch_rng" in state:
            torch.set_rng_state(state["torch_rng"])

    def optimizer_steps(self) -> int:
        """Adam updates so far (its per-parameter step counter): a fresh optimizer would restart it at 0."""
        states = [s for s in self.optimizer.state.values() if "step" in s]
        return int(states[0]["step"]) if states else 0
