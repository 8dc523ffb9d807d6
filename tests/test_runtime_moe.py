"""A tiny mixture-of-experts model through the runtime's own engine and trainer (issue 16, point 5).

The catalog's tiny-qwen3-moe is built as transformers' Qwen3MoeForCausalLM (runtime.tiny_moe); the
same TorchEngine generates with it (behaviour logprobs equal a plain forward) and the same GRPO loop
trains it: a few steps move its weights, router and experts included, and train every sample once.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, MixtralForCausalLM, Qwen3MoeForCausalLM

from runtime.engine import Request, TorchEngine, generate
from runtime.model import CharTokenizer, build_model, toy_config
from runtime.tiny_hf import TinySpec, write_tiny_model
from runtime.tiny_moe import moe_tp_refusal
from runtime.toy import run_toy
from runtime.trainer import Rollout, pack, token_logprobs
from traces import get_model
from traces.hf_config import model_from_hf
from traces.io import load_yaml

TOK = CharTokenizer()
SPEC = get_model("tiny-qwen3-moe")


def moe_model() -> Qwen3MoeForCausalLM:
    return build_model(toy_config(TOK, SPEC.layers, SPEC.hidden, SPEC.heads, SPEC.kv_heads, SPEC.moe), seed=0)


def test_the_catalog_entry_is_the_model_the_runtime_builds() -> None:
    model = moe_model()
    assert isinstance(model, Qwen3MoeForCausalLM)
    assert sum(p.numel() for p in model.parameters()) == SPEC.params  # every expert counted, as the planner does
    assert model.config.num_experts == 4 and model.config.num_experts_per_tok == 2


def test_moe_behaviour_logprobs_match_a_recomputation() -> None:
    model = moe_model()
    prompts = ["3+4=", "12+3=", "1=", "9*9-3=", "5+5=", "7+1="]
    engine = TorchEngine(model, TOK.eos_id, TOK.pad_id, max_batch=3, seed=1)  # rows join and leave the batch
    done = generate(engine, [Request(i, tuple(TOK.encode(p)), 6 - i % 3) for i, p in enumerate(prompts)])
    batch = pack([Rollout(c.prompt, c.tokens, c.logprobs, c.versions, 0.0, 0) for c in done], TOK.pad_id)
    with torch.no_grad():
        logp = token_logprobs(model, batch.ids, batch.attention)
    err = max(abs(a - b) for i, c in enumerate(done) for a, b in zip(c.logprobs, logp[i][batch.response[i]].tolist(),
                                                                    strict=True))
    assert err < 1e-4


def test_a_few_grpo_steps_train_the_moe_model(tmp_path: Path) -> None:
    steps, prompts, group = 3, 4, 8
    before = {k: v.clone() for k, v in moe_model().state_dict().items()}
    result = run_toy(steps, engines=1, staleness=1, seed=0, out_dir=tmp_path, prompts_per_step=prompts,
                     group_size=group, hidden=SPEC.hidden, layers=SPEC.layers, heads=SPEC.heads,
                     kv_heads=SPEC.kv_heads, moe=SPEC.moe)
    assert result.steps == steps
    assert sorted(result.trained_sids) == sorted(set(result.trained_sids))  # none twice
    assert len(result.trained_sids) == steps * prompts * group
    after = AutoModelForCausalLM.from_pretrained(str(tmp_path / "initial_model")).state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # the folder holds the seed's initial weights
    final = torch.load(sorted((tmp_path / "checkpoints").glob("trainer-*.pt"))[-1], weights_only=True)["model"]
    moved = {k for k in before if not torch.equal(before[k], final[k])}
    assert any(".mlp.gate." in k for k in moved), "the router did not train"
    assert any(".mlp.experts." in k for k in moved), "no expert trained"
    assert max(result.staleness_tokens)[0] <= 1


@pytest.mark.parametrize(("family", "cls"), [("qwen3_moe", Qwen3MoeForCausalLM), ("mixtral", MixtralForCausalLM)])
def test_tiny_hf_writes_moe_folders_that_auto_classes_load(family: str, cls: type, tmp_path: Path) -> None:
    folder = write_tiny_model(tmp_path / family, TinySpec(family=family))
    model = AutoModelForCausalLM.from_pretrained(str(folder))
    assert isinstance(model, cls)
    # the planner reads the same folder's config.json to the same size (what a --model run's prediction uses)
    spec = model_from_hf(load_yaml(folder / "config.json"), family, "test")
    assert spec.moe is not None and spec.params == sum(p.numel() for p in model.parameters())


def test_trainer_tp_on_an_moe_model_is_refused_in_one_line() -> None:
    why = moe_tp_refusal(moe_model().config, 2)
    assert why is not None and "tp=2" in why and "\n" not in why
    assert moe_tp_refusal(moe_model().config, 1) is None
    assert moe_tp_refusal(AutoConfig.for_model("llama"), 2) is None


def test_vllm_on_cpu_refuses_an_moe_model_with_the_measured_reason() -> None:
    from runtime.engine_spec import default_engine, on_cpu, vllm_blocker

    why = vllm_blocker(moe_model().config)
    if importlib.util.find_spec("vllm") is None or not on_cpu():
        pytest.skip("the refusal is for vLLM's CPU build")
    assert why is not None and "weight reload" in why and "--engine torch" in why
    assert default_engine(moe_model().config) == "torch"  # the default never picks an engine that cannot sync
