"""GRPO advantages, AReaL's decoupled PPO loss, and the trainer's step and checkpoints."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from runtime.model import CharTokenizer, build_model, tiny_llama_config
from runtime.trainer import Rollout, TrainConfig, Trainer, decoupled_ppo_loss, grpo_advantages, pack, token_logprobs


def test_grpo_advantages_are_normalised_within_each_group() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 5.0, 5.0, 1.0, 3.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 2, 2])
    adv = grpo_advantages(rewards, groups)
    assert torch.allclose(adv[:4], torch.tensor([math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3),
                                                 -1 / math.sqrt(3)]), atol=1e-4)
    assert torch.equal(adv[4:6], torch.zeros(2))  # no signal in a group of equal rewards
    assert torch.allclose(adv[6:], torch.tensor([-1.0, 1.0]), atol=1e-4)
    for g in range(3):  # mean 0 in every group
        assert abs(float(adv[groups == g].mean())) < 1e-6


def _loss(logp: torch.Tensor, prox: torch.Tensor, behav: torch.Tensor, adv: torch.Tensor,
          cap: float | None = 5.0) -> tuple[torch.Tensor, torch.Tensor]:
    logp = logp.clone().requires_grad_(True)
    loss, _ = decoupled_ppo_loss(logp, prox, behav, adv, torch.ones_like(logp, dtype=torch.bool), 0.2, cap)
    loss.backward()
    assert logp.grad is not None
    return loss.detach(), logp.grad


def test_zero_advantages_give_zero_loss_and_gradient() -> None:
    g = torch.Generator().manual_seed(0)
    logp, prox, behav = (-torch.rand(3, 5, generator=g) for _ in range(3))
    loss, grad = _loss(logp, prox, behav, torch.zeros(3, 5))
    assert float(loss) == 0.0
    assert torch.count_nonzero(grad) == 0


def test_on_policy_loss_is_minus_mean_advantage_with_policy_gradient() -> None:
    """pi = pi_prox = pi_behav: ratio 1, weight 1; d loss / d logp = -A / tokens (REINFORCE)."""
    logp = torch.log(torch.tensor([[0.5, 0.25], [0.1, 0.9]]))
    adv = torch.tensor([[1.0, 1.0], [-2.0, -2.0]])
    loss, grad = _loss(logp, logp, logp, adv)
    assert math.isclose(float(loss), float(-adv.mean()), abs_tol=1e-6)
    assert torch.allclose(grad, -adv / 4)


def test_clipping_bounds_the_ratio() -> None:
    prox = torch.zeros(1, 4)
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.5, 0.5]]))  # ratio 1.5 and 0.5, outside [0.8, 1.2]
    adv = torch.tensor([[1.0, -1.0, -1.0, 1.0]])
    loss, grad = _loss(logp, prox, prox, adv)
    # ratio 1.5, A > 0 and ratio 0.5, A < 0: clipped, no gradient; the other two move the policy back
    assert grad[0, 0] == 0 and grad[0, 1] == 0
    assert grad[0, 2] != 0 and grad[0, 3] != 0
    assert math.isclose(float(loss), -(1.2 * 1 + 0.8 * -1 + 1.5 * -1 + 0.5 * 1) / 4, abs_tol=1e-6)


def test_stale_tokens_get_capped_behaviour_weights() -> None:
    """Weight pi_prox / pi_behav multiplies each token's term; tokens above the cap are dropped."""
    prox = torch.log(torch.tensor([[0.4, 0.4, 0.9]]))
    behav = torch.log(torch.tensor([[0.4, 0.2, 0.1]]))  # weights 1, 2, 9
    adv = torch.ones(1, 3)
    loss, grad = _loss(prox, prox, behav, adv, cap=5.0)
    assert torch.allclose(grad, torch.tensor([[-1.0, -2.0, 0.0]]) / 3)
    assert math.isclose(float(loss), -(1 + 2) / 3, abs_tol=1e-6)
    _, grad_uncapped = _loss(prox, prox, behav, adv, cap=None)
    assert math.isclose(float(grad_uncapped[0, 2]), -9 / 3, rel_tol=1e-5)


def _rollouts(tok: CharTokenizer) -> list[Rollout]:
    out = []
    for i, (prompt, answer, reward) in enumerate([("1+2=", "3", 1.0), ("1+2=", "4", 0.0), ("5+7=", "12", 1.0),
                                                  ("5+7=", "2", 0.0)]):
        tokens = (*tok.encode(answer, bos=False), tok.eos_id)
        out.append(Rollout(tuple(tok.encode(prompt)), tokens, tuple([-2.0] * len(tokens)), (0,) * len(tokens),
                           reward, group=i // 2))
    return out


def test_train_step_raises_the_rewarded_answers(tmp_path: Path) -> None:
    tok = CharTokenizer()
    model = build_model(tiny_llama_config(tok), seed=0)
    rollouts = _rollouts(tok)
    trainer = Trainer(model, tok.pad_id, TrainConfig(lr=1e-2, minibatches=1), seed=0)
    batch = pack(rollouts, tok.pad_id)

    def seq_logp() -> torch.Tensor:
        with torch.no_grad():
            return (token_logprobs(trainer.model, batch.ids, batch.attention) * batch.response).sum(-1)

    before = seq_logp()
    for _ in range(5):
        stats = trainer.train_step(rollouts)
    after = seq_logp()
    assert trainer.version == 5 and stats.step == 4 and stats.samples == 4
    assert dict(stats.lags) == {4: stats.tokens}  # tokens of version 0 trained at step 4
    assert after[0] > before[0] and after[2] > before[2]  # rewarded answers up
    assert after[1] < before[1] and after[3] < before[3]  # the others down

    path = tmp_path / "ck" / "checkpoint.pt"
    trainer.save_checkpoint(path)
    assert [p.name for p in path.parent.iterdir()] == ["checkpoint.pt"]  # no temp file left behind
    other = Trainer(build_model(tiny_llama_config(tok), seed=1), tok.pad_id)
    other.load_checkpoint(path)
    assert other.version == 5
    for (name, a), b in zip(trainer.model.state_dict().items(), other.model.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
