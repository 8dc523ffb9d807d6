"""The torch rollout engine: behaviour logprobs, continuous batching, weight loads; the model folder."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

from runtime.engine import Completion, Request, TorchEngine, generate
from runtime.model import CharTokenizer, build_model, load_model, save_model, tiny_llama_config
from runtime.trainer import Rollout, pack, token_logprobs

TOK = CharTokenizer()
PROMPTS = ["3+4=", "12+3=", "1=", "9*9-3=", "5+5=", "7+1=", "2=", "8+8+8=", "6-1=", "45*2="]




@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    return build_model(tiny_llama_config(TOK), seed=0)


def requests(max_new: int = 6) -> list[Request]:
    # different prompt lengths and budgets, so rows join and leave the running batch at different times
    return [Request(i, tuple(TOK.encode(p)), max_new - i % 3) for i, p in enumerate(PROMPTS)]


def recompute(model: LlamaForCausalLM, done: list[Completion]) -> list[list[float]]:
    """The same tokens through the trainer's plain (right-padded, no cache) forward."""
    rollouts = [Rollout(c.prompt, c.tokens, c.logprobs, c.versions, 0.0, 0) for c in done]
    batch = pack(rollouts, TOK.pad_id)
    with torch.no_grad():
        logp = token_logprobs(model, batch.ids, batch.attention)
    return [logp[i][batch.response[i]].tolist() for i in range(len(done))]


def max_error(done: list[Completion], expected: list[list[float]]) -> float:
    return max(abs(a - b) for c, e in zip(done, expected, strict=True) for a, b in zip(c.logprobs, e, strict=True))


def test_behaviour_logprobs_match_a_recomputation(model: LlamaForCausalLM) -> None:
    engine = TorchEngine(model, TOK.eos_id, TOK.pad_id, max_batch=4, seed=1)  # 10 requests, 4 slots
    done = generate(engine, requests())
    assert [c.sid for c in done] == list(range(len(PROMPTS)))
    for c, r in zip(done, requests(), strict=True):
        assert 1 <= len(c.tokens) <= r.max_new_tokens
        assert c.finished == (c.tokens[-1] == TOK.eos_id)
        assert c.versions == (0,) * len(c.tokens)
    assert max_error(done, recompute(model, done)) < 1e-4
    stats = engine.stats()
    assert stats.completed == len(PROMPTS) and stats.generated_tokens == sum(len(c.tokens) for c in done)
    assert {iv.activity for iv in engine.drain_intervals()} == {"prefill", "decode"}


def test_same_seed_same_samples(model: LlamaForCausalLM) -> None:
    a = generate(TorchEngine(model, TOK.eos_id, TOK.pad_id, max_batch=3, seed=7), requests())
    b = generate(TorchEngine(model, TOK.eos_id, TOK.pad_id, max_batch=3, seed=7), requests())
    c = generate(TorchEngine(model, TOK.eos_id, TOK.pad_id, max_batch=3, seed=8), requests())
    assert [x.tokens for x in a] == [x.tokens for x in b]
    assert [x.tokens for x in a] != [x.tokens for x in c]


def test_interrupted_rollouts_carry_each_tokens_version(model: LlamaForCausalLM) -> None:
    """A load mid-generation re-prefills with the new weights; each token's logprob is its version's."""
    new = build_model(tiny_llama_config(TOK), seed=5)
    engine = TorchEngine(model, TOK.eos_id, TOK.pad_id, max_batch=16, seed=2)
    reqs = [Request(i, tuple(TOK.encode(p)), 8) for i, p in enumerate(PROMPTS)]
    engine.submit(reqs)
    done = {c.sid: c for c in engine.step() + engine.step()}  # two tokens at version 0
    engine.load_weights(new.state_dict(), version=1)
    assert engine.accepting(1) and not engine.accepting(0)
    while not engine.idle():
        done.update((c.sid, c) for c in engine.step())
    assert engine.version == 1
    finished = [done[r.sid] for r in reqs]
    mixed = [c for c in finished if 0 in c.versions and 1 in c.versions]
    assert mixed, "some rollout should span the weight load"
    old_lp, new_lp = recompute(model, finished), recompute(new, finished)
    for c, lo, ln in zip(finished, old_lp, new_lp, strict=True):
        for v, got, a, b in zip(c.versions, c.logprobs, lo, ln, strict=True):
            assert abs(got - (a if v == 0 else b)) < 1e-4
    assert "reprefill" in {iv.activity for iv in engine.drain_intervals()}


def test_non_interruptible_engine_drains_then_loads(model: LlamaForCausalLM) -> None:
    new = build_model(tiny_llama_config(TOK), seed=5)
    engine = TorchEngine(model, TOK.eos_id, TOK.pad_id, max_batch=16, seed=3, interruptible=False)
    reqs = [Request(i, tuple(TOK.encode(p)), 8) for i, p in enumerate(PROMPTS)]
    engine.submit(reqs)
    done = engine.step()
    engine.load_weights(new.state_dict(), version=1)
    assert not engine.accepting(0) and not engine.accepting(1)  # draining: nothing new
    while not engine.idle():
        done += engine.step()
    assert all(c.versions == (0,) * len(c.tokens) for c in done)  # finished on the weights they started with
    engine.step()  # idle at a boundary: the load happens
    assert engine.version == 1 and engine.accepting(1)
    again = generate(engine, reqs[:3])
    assert all(set(c.versions) == {1} for c in again)
    assert max_error(again, recompute(new, again)) < 1e-4


def test_model_folder_loads_with_transformers(model: LlamaForCausalLM, tmp_path: Path) -> None:
    folder = save_model(model, TOK, tmp_path / "tiny")
    hf_tok = AutoTokenizer.from_pretrained(folder)
    assert hf_tok("9+8=").input_ids == TOK.encode("9+8=", bos=False)
    assert hf_tok.decode(TOK.encode("17", bos=False)) == "17"
    assert hf_tok.eos_token_id == TOK.eos_id and hf_tok.pad_token_id == TOK.pad_id
    ids = torch.tensor([TOK.encode("9+8=")])
    for loaded in (AutoModelForCausalLM.from_pretrained(folder), load_model(folder)):
        with torch.no_grad():
            assert torch.allclose(loaded(input_ids=ids).logits, model(input_ids=ids).logits, atol=1e-6)
