"""A real model and data set: rewards, the data-set reader, the tiny Hugging Face folder, and bad input.

The model is the tiny Qwen2 of runtime.tiny_hf (a BPE tokenizer trained with `tokenizers` on the
shipped corpus, random weights from a config), built once per session (conftest's `tiny_hf`), and
loaded by transformers' Auto classes as a downloaded checkpoint would be.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from runtime import arith_data
from runtime.data_task import DatasetTask
from runtime.dataset import Record, load_records
from runtime.hf_model import check_folder, load_causal_lm, load_tokenizer
from runtime.rewards import addition_reward, final_answer, load_reward, math_reward
from traces.errors import SpecError

SHIPPED = "runtime/data/arith_word.jsonl"


@pytest.mark.parametrize(("response", "answer", "reward"), [
    ("5", "5", 1.0),
    ("so she has 5 apples.", "5", 1.0),  # the last number
    ("3 + 2 = 5", "5", 1.0),
    ("3 + 2 = 6", "5", 0.0),
    ("5 then 4", "5", 0.0),  # the last number decides, not any number
    ("the answer is \\boxed{7}, not 5", "7", 1.0),  # a boxed answer beats a later number
    ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),  # numbers compare as exact fractions
    ("1/2", "\\boxed{\\dfrac{1}{2}}", 1.0),  # a MATH-style reference
    ("It costs $1,000.", "1000", 1.0),  # thousands commas, dollars, the period
    ("5.0", "5", 1.0),
    ("8-3 is 5", "#### 5", 1.0),  # GSM8K's reference format; 8-3 is not minus 3
    ("-4", "-4", 1.0),
    ("no number here", "5", 0.0),
    ("", "5", 0.0),
    ("\\boxed{5", "5", 1.0),  # an unclosed box is no final answer: the last number counts
])
def test_math_reward_reads_the_final_answer(response: str, answer: str, reward: float) -> None:
    assert math_reward(response, answer) == reward


def test_addition_reward_is_the_whole_response() -> None:
    assert addition_reward(" 7 ", "7") == 1.0 and addition_reward("7 apples", "7") == 0.0
    assert final_answer("x = 12, y = 3") == "3"


def test_reward_specs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_rewards.py").write_text("def length(response, answer):\n    return len(response) / 10\n"
                                            "NOT_A_FUNCTION = 3\n")
    (tmp_path / "broken_rewards.py").write_text("raise RuntimeError('boom')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_reward("math") is math_reward and load_reward("addition") is addition_reward
    assert load_reward("my_rewards:length")("abcde", "") == 0.5
    for spec, words in [("mystery", "not a built-in"), ("no_such_module_x:f", "does not import"),
                        ("my_rewards:missing", "no function 'missing'"),
                        ("my_rewards:NOT_A_FUNCTION", "no function"), ("broken_rewards:f", "RuntimeError: boom"),
                        (":f", "not a built-in"), ("json:", "not a built-in")]:
        with pytest.raises(SpecError, match=words):
            load_reward(spec)
    sys.modules.pop("my_rewards", None)


def test_a_reward_module_in_the_working_folder_imports(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As `rlfleet` (a console script, whose sys.path lacks the working folder) is run from a project folder."""
    (tmp_path / "cwd_rewards.py").write_text("def exact(response, answer):\n    return float(response == answer)\n")
    monkeypatch.chdir(tmp_path)
    before = list(sys.path)
    assert load_reward("cwd_rewards:exact")("4", "4") == 1.0
    assert sys.path == before  # the folder was on the path for the import only
    sys.modules.pop("cwd_rewards", None)


def test_shipped_data_is_what_the_script_writes() -> None:
    assert Path(SHIPPED).read_text(encoding="utf-8") == arith_data.dataset_text()
    assert arith_data.CORPUS_FILE.read_text(encoding="utf-8") == arith_data.corpus_text()
    records = load_records(SHIPPED)
    assert len(records) == arith_data.DATASET_SIZE
    answers = [int(r.answer) for r in records]
    assert set(answers) == set(range(arith_data.MAX_ANSWER + 1))
    assert max(answers.count(a) for a in set(answers)) / len(answers) < 0.15  # answer-balanced (1/9 each)


def test_dataset_reader(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text('{"q": "What is 1 + 2?", "a": 3}\n\n{"q": "Two?", "a": "2", "extra": 1}\n')
    assert load_records(path, "q", "a") == (Record("What is 1 + 2?", "3"), Record("Two?", "2"))
    import pandas as pd

    parquet = tmp_path / "d.parquet"
    pd.DataFrame({"question": ["What is 2 + 2?"], "answer": [4]}).to_parquet(parquet)
    assert load_records(parquet, "question") == (Record("What is 2 + 2?", "4"),)


@pytest.mark.parametrize(("text", "words"), [
    ("", "the data set is empty"),
    ("\n  \n", "the data set is empty"),
    ('{"prompt": "hi"}\n', r"d.jsonl:1: no field 'answer' \(fields: 'prompt'\).*--answer-field"),
    ('{"prompt": "a", "answer": "1"}\n{"question": "b", "answer": "2"}\n', r"d.jsonl:2: no field 'prompt'"),
    ('{"prompt": "a", "answer": "1"}\nnot json\n', "d.jsonl:2: not JSON"),
    ('["a", "1"]\n', "expected a JSON object"),
    ('{"prompt": 5, "answer": "1"}\n', "'prompt' must be non-empty text"),
    ('{"prompt": "a", "answer": null}\n', "'answer' must be text or a number"),
    ('{"prompt": "a", "answer": true}\n', "'answer' must be text or a number"),
])
def test_dataset_refusals(tmp_path: Path, text: str, words: str) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(text)
    with pytest.raises(SpecError, match=words):
        load_records(path)


def test_dataset_task_refuses_conflicts_and_bad_rewards(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    records = [Record("What is 1 + 1?", "2"), Record("What is 1 + 1?", "3")]
    with pytest.raises(SpecError, match="twice, with answers '2' and '3'"):
        DatasetTask.build(records, str, math_reward, "math", 4)
    (tmp_path / "odd_rewards.py").write_text("def text(response, answer):\n    return 'yes'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(SpecError, match=r"returned 'yes'.*finite number"):
        DatasetTask.build(records[:1], str, load_reward("odd_rewards:text"), "odd_rewards:text", 4)


def test_dataset_task_scores_on_answers() -> None:
    records = [Record(f"What is {a} + 0?", str(a)) for a in (1, 1, 1, 2)] + [Record("What is 9 + 0?", "9")]
    task = DatasetTask.build(records, lambda p: f"<{p}>", math_reward, "math", 4, eval_size=3)
    assert task.reward("<What is 2 + 0?>", "it is 2", False) == 1.0  # scored on text, cut or not
    assert task.reward("<What is 2 + 0?>", "3", True) == 0.0
    assert sorted(task.eval_prompts) == ["<What is 1 + 0?>", "<What is 2 + 0?>", "<What is 9 + 0?>"]
    assert task.uniform_chance == pytest.approx(1 / 3)  # three distinct prompts, three answers: one right
    assert sum(w for _, w in task.eval_weights()) == pytest.approx(1.0)


def test_tiny_folder_is_a_hugging_face_checkpoint(tiny_hf: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2ForCausalLM

    tok, model = AutoTokenizer.from_pretrained(tiny_hf), AutoModelForCausalLM.from_pretrained(tiny_hf)
    assert isinstance(model, Qwen2ForCausalLM) and model.config.vocab_size == len(tok) < 200
    assert tok.chat_template and tok.eos_token == "<|im_end|>"
    ids = tok.encode("Ann has 12 pens.", add_special_tokens=False)
    pieces = tok.convert_ids_to_tokens(ids)
    assert "1" in pieces and "2" in pieces and len(ids) < len("Ann has 12 pens.")  # subwords, digits one by one
    assert tok.decode(ids) == "Ann has 12 pens."

    hf = load_tokenizer(tiny_hf)
    text = hf.render("What is 1 + 2?")
    assert text == "<|im_start|>user\nWhat is 1 + 2?<|im_end|>\n<|im_start|>assistant\n"
    assert hf.encode(text) == tok.apply_chat_template([{"role": "user", "content": "What is 1 + 2?"}],
                                                      add_generation_prompt=True, tokenize=True, return_dict=False)
    three = tok.encode("3", add_special_tokens=False)
    assert hf.decode([*three, hf.eos_id, *three]) == "3"  # up to the first eos
    assert load_causal_lm(tiny_hf).config.model_type == "qwen2"


def test_model_folder_refusals(tmp_path: Path) -> None:
    from transformers import T5Config

    T5Config(d_model=32, num_layers=1, num_heads=2, d_ff=64, vocab_size=50).save_pretrained(tmp_path / "t5")
    with pytest.raises(SpecError, match="model_type 't5' is not a causal LM"):
        check_folder(tmp_path / "t5")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SpecError, match=r"no config\.json"):
        check_folder(tmp_path / "empty")
    with pytest.raises(SpecError, match="not a folder"):
        check_folder(tmp_path / "missing")
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "config.json").write_text(json.dumps({"hidden_size": 4}))
    with pytest.raises(SpecError, match="no model_type"):
        check_folder(tmp_path / "odd")


@pytest.mark.parametrize(("flags", "words"), [
    (["--dataset", SHIPPED], "--dataset needs --model"),
    (["--model", "{tiny}"], "--model needs --dataset"),
    (["--model", "{tiny}", "--dataset", "{tmp}/empty.jsonl"], "the data set is empty"),
    (["--model", "{tiny}", "--dataset", SHIPPED, "--prompt-field", "question"], "no field 'question'"),
    (["--model", "{tiny}", "--dataset", SHIPPED, "--reward", "mystery"], "not a built-in"),
    (["--model", "{tmp}/t5", "--dataset", SHIPPED], "not a causal LM"),
    (["--model", "{tmp}", "--dataset", SHIPPED], "no config.json"),
    (["--model", "{tiny}", "--dataset", SHIPPED, "--max-new-tokens", "500"], "exceeds its context of 128"),
])
def test_rlfleet_run_refuses_bad_model_and_data_in_one_line(cli, tiny_hf: Path, tmp_path: Path, flags: list[str],
                                                            words: str) -> None:  # type: ignore[no-untyped-def]
    from transformers import T5Config

    T5Config(d_model=32, num_layers=1, num_heads=2, d_ff=64, vocab_size=50).save_pretrained(tmp_path / "t5")
    (tmp_path / "empty.jsonl").write_text("")
    argv = [f.format(tiny=tiny_hf, tmp=tmp_path) for f in flags]
    res = cli("run", "traces/data/plans/toy-cpu.json", "--steps", "1", "--in-process", *argv)
    assert res.code == 2, res.err
    assert words in res.err and len(res.err.strip().splitlines()) == 1, res.err


def test_rlfleet_run_trains_a_hf_folder_on_a_jsonl_file(cli, tiny_hf: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import yaml

    res = cli("run", "traces/data/plans/toy-cpu.json", "--model", str(tiny_hf), "--dataset", SHIPPED,
              "--max-new-tokens", "2", "--lr", "3e-3", "--steps", "3", "--in-process", "--out", str(tmp_path), "--json")
    assert res.code == 0, res.err
    out = res.json()
    assert out["steps"] == 3 and out["executor"] == "in-process" and 0 <= out["eval_before"] <= 1
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(set(r["response_lengths"]) <= {"1", "2"} for r in rows)
    workload = yaml.safe_load((tmp_path / "workload.yaml").read_text())
    assert workload["name"] == "arith_word-observed"
    assert (workload["model"]["hidden"], workload["model"]["vocab"]) == (64, json.loads(
        (tiny_hf / "config.json").read_text())["vocab_size"])  # the folder's shape, read by traces.hf_config
    assert not (tmp_path / "initial_model").exists()  # engines load the --model folder itself


def test_rlfleet_run_refuses_data_flags_on_the_toy_task(cli) -> None:  # type: ignore[no-untyped-def]
    res = cli("run", "traces/data/plans/toy-cpu.json", "--steps", "1", "--in-process", "--reward", "addition")
    assert res.code == 2 and "--reward applies to --dataset runs" in res.err and len(res.err.splitlines()) == 1


def test_a_hf_run_resumes_only_with_its_own_data_and_reward(cli, tiny_hf: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    run = ("run", "traces/data/plans/toy-cpu.json", "--model", str(tiny_hf), "--dataset", SHIPPED,
           "--max-new-tokens", "1", "--in-process", "--json")
    first = cli(*run, "--steps", "2", "--out", str(tmp_path))
    assert first.code == 0, first.err
    other = cli(*run, "--steps", "3", "--resume", str(tmp_path), "--reward", "addition")
    assert other.code == 2 and "different run (task" in other.err and len(other.err.splitlines()) == 1
    resumed = cli(*run, "--steps", "3", "--resume", str(tmp_path))
    assert resumed.code == 0, resumed.err
    assert resumed.json()["resumed_from"] == 2 and resumed.json()["version"] == 3
