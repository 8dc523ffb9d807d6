"""Mixture-of-experts models: presets against hand counts from their config.json, the distinct-experts
formula against a Monte-Carlo draw of top-k routing, and the cost model's MoE terms (traces/moe.py,
traces/mla.py, traces/costmodel/experts.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from traces import CostModel, SpecError, get_gpu, get_model
from traces.costmodel import roofline as rf
from traces.hf_config import model_from_hf
from traces.moe import expected_distinct_experts

CONFIGS = Path(__file__).parent / "data" / "hf_configs"
CM = CostModel.roofline_only()


def _swiglu(h: int, f: int) -> int:
    return 3 * h * f


def _gqa(h: int, heads: int, kv: int, d: int, bias: bool) -> int:
    return h * heads * d + 2 * h * kv * d + heads * d * h + ((heads + 2 * kv) * d if bias else 0)


# Hand counts from each model's config.json fields, written out term by term (not through ModelSpec):
# (total params, params a token passes through), embeddings and LM head included.
def _qwen3_moe(layers: int, h: int, heads: int, f: int, experts: int, vocab: int) -> tuple[int, int]:
    attn = _gqa(h, heads, 4, 128, False) + 2 * 128 + 2 * h  # q/k norms, two layer norms
    router = experts * h
    total = layers * (attn + router + experts * _swiglu(h, f)) + 2 * vocab * h + h
    active = layers * (attn + router + 8 * _swiglu(h, f)) + 2 * vocab * h + h
    return total, active


def _deepseek_v3() -> tuple[int, int]:
    h, heads = 7168, 128
    q = h * 1536 + 1536 + 1536 * heads * (128 + 64)
    kv = h * (512 + 64) + 512 + 512 * heads * (128 + 128)
    attn = q + kv + heads * 128 * h + 2 * h
    moe_mlp = 256 * h + _swiglu(h, 2048)  # router + one shared expert
    total = 61 * attn + 3 * _swiglu(h, 18432) + 58 * (moe_mlp + 256 * _swiglu(h, 2048)) + 2 * 129280 * h + h
    active = 61 * attn + 3 * _swiglu(h, 18432) + 58 * (moe_mlp + 8 * _swiglu(h, 2048)) + 2 * 129280 * h + h
    return total, active


def _gpt_oss(layers: int, experts: int) -> tuple[int, int]:
    h = 2880
    attn = _gqa(h, 64, 8, 64, True) + 2 * h
    expert = _swiglu(h, 2880) + 2 * 2880 + h  # gate_up bias (2 f) and down bias (h)
    router = experts * h + experts
    total = layers * (attn + router + experts * expert) + 2 * 201088 * h + h
    active = layers * (attn + router + 4 * expert) + 2 * 201088 * h + h
    return total, active


HAND = {
    "qwen3-30b-a3b": _qwen3_moe(48, 2048, 32, 768, 128, 151936),
    "qwen3-235b-a22b": _qwen3_moe(94, 4096, 64, 1536, 128, 151936),
    "deepseek-v3": _deepseek_v3(),
    "gpt-oss-120b": _gpt_oss(36, 128),
    "gpt-oss-20b": _gpt_oss(24, 32),
}
# The totals the model cards publish (billions), to within 1% (they round; gpt-oss's and
# DeepSeek's active counts leave out the input embedding).
PUBLISHED = {"qwen3-30b-a3b": 30.5, "qwen3-235b-a22b": 235, "deepseek-v3": 671, "gpt-oss-120b": 116.8,
             "gpt-oss-20b": 20.9}


@pytest.mark.parametrize("name", sorted(HAND))
def test_preset_parameters_and_flops_equal_the_hand_count(name: str) -> None:
    model = get_model(name)
    total, active = HAND[name]
    assert model.params == total and model.active_params == active
    assert model.weight_bytes == 2 * total  # memory holds every expert
    assert abs(model.params / 1e9 / PUBLISHED[name] - 1) < 0.01
    # training FLOPs per token: 6 x the active matmul parameters (LM head in, embedding lookup out)
    seq = 4096
    flops = float(rf.train_flops_per_token(model, seq))
    assert flops == 6 * (active - model.vocab * model.hidden - model.hidden) + 12 * model.layers * seq * model.attn_dim


def test_a_dense_model_has_no_expert_terms() -> None:
    dense = get_model("llama-3.1-8b")
    assert dense.params == dense.active_params and dense.expert_params == 0 and dense.moe_layers == 0


def test_mla_caches_the_latent_once_per_layer() -> None:
    ds = get_model("deepseek-v3")
    assert ds.kv_bytes_per_token == 61 * (512 + 64) * 2 and ds.kv_shards == 1


@pytest.mark.parametrize(("experts", "top_k"), [(8, 2), (128, 8), (256, 8), (32, 4)])
@pytest.mark.parametrize("tokens", [1, 3, 16, 64, 160])
def test_distinct_experts_match_a_monte_carlo_draw_of_top_k_routing(experts: int, top_k: int, tokens: int) -> None:
    rng = np.random.default_rng(0)
    trials = 400
    # each token routes to top_k distinct experts: the top_k of random scores
    picks = np.argpartition(rng.random((trials, tokens, experts), dtype=np.float32), top_k - 1, axis=-1)[..., :top_k]
    hit = np.zeros((trials, experts), bool)
    np.put_along_axis(hit, picks.reshape(trials, -1), True, axis=1)
    drawn = hit.sum(axis=1).mean()
    assert float(expected_distinct_experts(experts, top_k, tokens)) == pytest.approx(drawn, rel=0.02)


def _weight_seconds(model_name: str, batch: int) -> tuple[float, float, float]:
    """(decode iteration seconds, active-weights time, all-weights time) on one H200 at short context."""
    gpu, model = get_gpu("H200"), get_model(model_name)
    eff = CM.efficiency
    per_byte = 1 / (gpu.hbm_bytes_per_s * eff.memory)
    overhead = eff.decode_overhead_s + eff.decode_overhead_per_seq_s * batch
    secs = float(CM.decode(gpu, model, 1, batch, 1).seconds) - overhead
    return secs, model.active_params * model.bytes_per_param * per_byte, model.weight_bytes * per_byte


def test_decode_reads_the_active_weights_at_batch_1_and_all_of_them_at_large_batch() -> None:
    one, active, every = _weight_seconds("qwen3-30b-a3b", 1)
    assert one == pytest.approx(active, rel=0.02)
    large, _, _ = _weight_seconds("qwen3-30b-a3b", 256)
    assert large == pytest.approx(every, rel=0.05)  # 256 x 8 picks of 128: ~all experts, plus a little KV
    mid, _, _ = _weight_seconds("qwen3-30b-a3b", 8)
    assert active < mid < every


def test_dense_decode_is_unchanged_by_the_expert_terms() -> None:
    gpu, model = get_gpu("H100"), get_model("llama-3.1-8b")
    eff = CM.efficiency
    b, ctx, t = 32.0, 1000.0, 2.0
    compute = (2 * model.compute_params * b + 4 * model.layers * b * ctx * model.q_dim) / (
        t * gpu.bf16_flops * gpu.matmul_ceiling * eff.matmul)
    memory = (model.weight_bytes + b * ctx * model.kv_bytes_per_token) / (t * gpu.hbm_bytes_per_s * eff.memory)
    comm = 2 * model.layers * float(rf.allreduce_seconds(b * model.hidden * 2, t, gpu.link_bytes_per_s, eff))
    want = max(compute, memory) + comm + eff.decode_overhead_s + eff.decode_overhead_per_seq_s * b
    assert float(CM.decode(gpu, model, t, b, ctx).seconds) == want


def test_expert_parallel_engine_holds_dense_weights_whole_and_experts_split() -> None:
    gpu, model = get_gpu("H100"), get_model("qwen3-30b-a3b")
    dense = model.weight_bytes - model.expert_bytes
    assert float(rf.engine_weight_bytes_per_gpu(model, 8, 8)) == pytest.approx(dense + model.expert_bytes / 8)
    assert float(rf.engine_weight_bytes_per_gpu(model, 8, 1)) == pytest.approx(model.weight_bytes / 8)
    # 4 KV heads: TP8 replicates each twice, data-parallel attention does not, so EP holds more tokens
    assert float(CM.kv_capacity_tokens(gpu, model, 8, 8)) > float(CM.kv_capacity_tokens(gpu, model, 8, 1))


def test_trainer_ep_shards_expert_states_and_cuts_their_gradient_traffic() -> None:
    model, gpu = get_model("qwen3-30b-a3b"), get_gpu("H100")
    dense, experts = model.params - model.expert_params, model.expert_params
    # ZeRO-1 over dp 8, tp 1: 4 bytes of weights + grads per parameter on every rank, 12 / 8 of optimizer
    no_ep = float(rf.train_state_bytes(model, 8, 1, 1, zero_stage=1))
    assert no_ep == pytest.approx((dense + experts) * (4 + 12 / 8))
    ep8 = float(rf.train_state_bytes(model, 8, 1, 1, zero_stage=1, ep=8))
    assert ep8 == pytest.approx(dense * (4 + 12 / 8) + experts / 8 * 16)  # experts whole on 1 of 8, no ZeRO peer
    kw = {"seq_len": 4096, "microbatch_tokens": 4096, "zero_stage": 3}
    slow = float(CM.train(gpu, model, 16, 1, 1, 2**20, gpus_per_node=8, inter_node_bytes_per_s=25e9, **kw).seconds)
    fast = float(CM.train(gpu, model, 16, 1, 1, 2**20, gpus_per_node=8, inter_node_bytes_per_s=25e9, ep=8,
                          **kw).seconds)
    assert fast < slow  # ZeRO-3 gathers 1/8 of the experts per rank instead of all of them


def test_weight_sync_moves_every_parameter() -> None:
    model = get_model("qwen3-30b-a3b")
    secs = float(CM.sync(get_gpu("H100"), model, 1, 1e9).seconds)
    assert secs > model.weight_bytes / 1e9  # all 61 GB, not the 6.7 GB a token touches


# ---- config.json ------------------------------------------------------------------------------
# Architecture fields of the published config.json files (https://huggingface.co/<repo>/blob/main/config.json).
HF = {
    "qwen3-30b-a3b": {"model_type": "qwen3_moe", "num_hidden_layers": 48, "hidden_size": 2048,
                      "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
                      "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128,
                      "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [],
                      "vocab_size": 151936, "max_position_embeddings": 40960, "tie_word_embeddings": False,
                      "attention_bias": False, "torch_dtype": "bfloat16"},
    "deepseek-v3": {"model_type": "deepseek_v3", "num_hidden_layers": 61, "hidden_size": 7168,
                    "num_attention_heads": 128, "num_key_value_heads": 128, "intermediate_size": 18432,
                    "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1,
                    "num_experts_per_tok": 8, "first_k_dense_replace": 3, "q_lora_rank": 1536,
                    "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
                    "vocab_size": 129280, "max_position_embeddings": 163840, "tie_word_embeddings": False,
                    "torch_dtype": "bfloat16"},
    "gpt-oss-120b": {"model_type": "gpt_oss", "num_hidden_layers": 36, "hidden_size": 2880,
                     "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
                     "intermediate_size": 2880, "num_local_experts": 128, "num_experts_per_tok": 4,
                     "experts_per_token": 4, "vocab_size": 201088, "max_position_embeddings": 131072,
                     "tie_word_embeddings": False, "attention_bias": True, "torch_dtype": "bfloat16"},
}


@pytest.mark.parametrize("name", sorted(HF))
def test_an_moe_config_json_reads_as_its_preset(name: str) -> None:
    model = model_from_hf(HF[name], name, "hf_config")
    preset = get_model(name)
    assert model.params == preset.params and model.active_params == preset.active_params
    assert model.moe == preset.moe and model.mla == preset.mla and model.kv_bytes_per_token == preset.kv_bytes_per_token


def test_the_published_mixtral_config_reads_as_the_preset() -> None:
    model = model_from_hf(json.loads((CONFIGS / "Mixtral-8x7B-v0.1.json").read_text()), "mixtral-8x7b", "m")
    assert model.params == get_model("mixtral-8x7b").params and model.moe is not None and model.moe.experts == 8


@pytest.mark.parametrize(("change", "needle"), [
    ({"model_type": "qwen2_moe"}, "mixture-of-experts model_type 'qwen2_moe' is not supported"),
    ({"num_experts_per_tok": None}, "needs 'num_experts_per_tok'"),
    ({"mlp_only_layers": [3, 7]}, "field 'mlp_only_layers'"),
    ({"num_experts_per_tok": 200}, "experts_per_token (200) exceeds experts (128)"),
])
def test_bad_moe_configs_are_one_line_errors(change: dict[str, object], needle: str) -> None:
    config = {k: v for k, v in (HF["qwen3-30b-a3b"] | change).items() if v is not None}
    with pytest.raises(SpecError) as err:
        model_from_hf(config, "bad", "hf_config")
    assert needle in str(err.value) and "\n" not in str(err.value)



def test_an_inline_moe_model_loads_in_a_workload_and_round_trips() -> None:
    from traces import Workload
    from traces.io import validate

    preset = get_model("qwen3-30b-a3b")
    inline = preset.model_dump(mode="json") | {"name": "my-moe"}
    data = {"model": inline, "prompts_per_step": 4, "prompt_len": {"kind": "fixed", "value": 64},
            "response_len": {"kind": "fixed", "value": 64}}
    workload = validate(Workload, data, "w")
    assert workload.model.params == preset.params and workload.model.moe == preset.moe
    assert validate(Workload, workload.model_dump(), "dumped") == workload
    bad = inline | {"moe": {**inline["moe"], "dense_layers": 48}}
    with pytest.raises(SpecError, match="dense_layers") as err:
        validate(Workload, data | {"model": bad}, "w")
    assert "\n" not in str(err.value)
