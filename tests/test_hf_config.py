"""Workload models from Hugging Face config.json files (traces/hf_config.py).

tests/data/hf_configs/ holds the config.json files as published on the Hugging Face hub:
Qwen/Qwen2.5-7B-Instruct, meta-llama/Llama-3.1-8B, Qwen/Qwen3-8B and (MoE, tests/test_moe.py)
mistralai/Mixtral-8x7B-v0.1, each at https://huggingface.co/<org>/<name>/blob/main/config.json.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from traces import SpecError, Workload, get_model, load_workload
from traces.io import validate

CONFIGS = Path(__file__).parent / "data" / "hf_configs"
SHAPE: dict[str, Any] = {"prompts_per_step": 4, "prompt_len": {"kind": "fixed", "value": 64},
                         "response_len": {"kind": "fixed", "value": 64}}
SAME_AS = {"Qwen2.5-7B-Instruct": "qwen2.5-7b", "Llama-3.1-8B": "llama-3.1-8b", "Qwen3-8B": "qwen3-8b"}


def _workload(tmp_path: Path, model: Any, **fields: Any) -> Path:
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump({"model": model, **SHAPE, **fields}), encoding="utf-8")
    return path


def _config(name: str) -> dict[str, Any]:
    return json.loads((CONFIGS / f"{name}.json").read_text())


@pytest.mark.parametrize(("config", "preset"), SAME_AS.items())
def test_published_configs_match_the_presets(tmp_path: Path, config: str, preset: str) -> None:
    shutil.copy(CONFIGS / f"{config}.json", tmp_path / "config.json")
    model = load_workload(_workload(tmp_path, {"hf_config": "config.json"})).model
    ours = get_model(preset)
    assert model.params == pytest.approx(ours.params, rel=0.01)
    assert model.kv_bytes_per_token == ours.kv_bytes_per_token
    assert model.max_context == _config(config)["max_position_embeddings"]
    assert model.name == tmp_path.name.lower()  # a config.json is named for its folder


def test_the_path_is_relative_to_the_workload_file_and_names_the_model(tmp_path: Path) -> None:
    snapshot = Path("hub", "models--Qwen--Qwen3-8B", "snapshots", "ab12" * 10)  # the Hugging Face cache layout
    (tmp_path / snapshot).mkdir(parents=True)
    shutil.copy(CONFIGS / "Qwen3-8B.json", tmp_path / snapshot / "config.json")
    (tmp_path / "jobs").mkdir()
    job = _workload(tmp_path / "jobs", {"hf_config": f"../{snapshot}/config.json"})
    model = load_workload(job).model
    assert model.name == "qwen3-8b" and model.qk_norm and model.head_dim == 128
    named = load_workload(_workload(tmp_path, {"hf_config": str(CONFIGS / "Llama-3.1-8B.json"), "name": "mine"}))
    assert named.model.name == "mine" and not named.model.qkv_bias


def test_an_inline_config_and_a_dumped_workload_round_trip() -> None:
    data = {"model": {"hf_config": _config("Qwen2.5-7B-Instruct"), "name": "qwen-inline"}, **SHAPE}
    workload = validate(Workload, data, "w")
    assert workload.model.qkv_bias and workload.model.bytes_per_param == 2
    assert validate(Workload, workload.model_dump(), "dumped") == workload


def test_an_unsupported_moe_family_is_refused_in_one_line(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    config = _config("Mixtral-8x7B-v0.1") | {"model_type": "qwen2_moe"}
    res = cli("validate", "--workload", str(_workload(tmp_path, {"hf_config": config, "name": "moe"})))
    lines = res.err.strip().splitlines()
    assert res.code == 2 and len(lines) == 1 and "num_local_experts" in lines[0] and "qwen2_moe" in lines[0]


def _broken(change: dict[str, Any]) -> dict[str, Any]:
    config = _config("Llama-3.1-8B") | change
    return {k: v for k, v in config.items() if v is not None}


@pytest.mark.parametrize(("model", "needles"), [
    ({"hf_config": _broken({"hidden_size": None})}, ("hf_config", "missing field 'hidden_size'")),
    ({"hf_config": _broken({"vocab_size": "big"})}, ("field 'vocab_size'", "valid integer")),
    ({"hf_config": _broken({"num_hidden_layers": True})}, ("field 'num_hidden_layers'",)),
    ({"hf_config": _broken({"num_attention_heads": -4})}, ("field 'num_attention_heads'", "greater than or equal")),
    ({"hf_config": _broken({"num_key_value_heads": 5})}, ("num_key_value_heads", "must divide")),
    ({"hf_config": _broken({"torch_dtype": "int8"})}, ("torch_dtype", "'int8'", "bfloat16")),
    ({"hf_config": _broken({"model_type": "gpt2"})}, ("model_type 'gpt2'", "llama", "inline")),
    ({"hf_config": _broken({"tie_word_embeddings": "no"})}, ("field 'tie_word_embeddings'",)),
    ({"hf_config": _config("Llama-3.1-8B")}, ("no name", "add name:")),
    ({"hf_config": [1, 2], "name": "x"}, ("hf_config", "fields of a config.json", "list")),
    ({"hf_config": "missing.json"}, ("missing.json", "no such file")),
    ({"hf_config": "w.yaml", "name": "x"}, ("hf_config", "missing field")),
    ({"hf_config": _config("Llama-3.1-8B"), "name": "x", "layers": 3}, ("takes only name", "'layers'")),
    ({"hf_config": _config("Llama-3.1-8B"), "name": 7}, ("name must be text",)),
])
def test_bad_configs_are_one_line_naming_the_field(cli, tmp_path: Path, model: Any,
                                                   needles: tuple[str, ...]) -> None:  # type: ignore[no-untyped-def]
    res = cli("validate", "--workload", str(_workload(tmp_path, model)))
    lines = res.err.strip().splitlines()
    assert (res.code, res.out, len(lines)) == (2, "", 1), res.err
    assert all(n in lines[0] for n in needles), lines[0]


def test_samples_longer_than_the_models_context_are_refused() -> None:
    config = _config("Qwen2.5-7B-Instruct")
    data = {"model": {"hf_config": config, "name": "q"}, **SHAPE,
            "response_len": {"kind": "fixed", "value": config["max_position_embeddings"]}}
    with pytest.raises(SpecError, match=r"exceeds the 32768-token context of q; lower the caps"):
        validate(Workload, data, "w")
    data["response_len"]["value"] -= 64
    assert validate(Workload, data, "w").max_seq_len == 32768
