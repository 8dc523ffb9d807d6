"""Acceptance of issue 14's point 4: GRPO raises the `math` reward of a Hugging Face model on a JSONL data set.

The model is the tiny Qwen2 folder (runtime.tiny_hf: a BPE tokenizer trained on the shipped corpus,
random weights), loaded by AutoTokenizer / AutoModelForCausalLM; the data set is the shipped
runtime/data/arith_word.jsonl, every prompt in the tokenizer's chat template. No supervised step:
the weights start random and only the RL steps change them.

The response cap is one token. A random model spreads its mass over the ~110-token vocabulary, so
at first about 1 answer in 50 is right; with longer responses the one right digit shares its
advantage with junk tokens, and in the same budget the reward barely moved (measured, 16 prompts x
16 samples, 60 steps: 0.036 -> 0.06 at 3 tokens, 0.019 -> 0.11 at one). What the steps here teach
is to answer with a number in the answers' range: the reward rises to about the prompt-blind level
(~1/9), not yet above it (150 steps of 16 x 16 stayed there: 0.134 against 0.156 for the best
constant answer of the evaluation set; 300 steps of 8 x 16 got above it, 0.220, reading the
problem: too long for a test, 117 s of training). 8 prompts x 16 samples a step: groups of 16 find a rewarded
answer often enough (groups of 8 collapsed onto a few digits), and half the batch halves the time.
"""

from __future__ import annotations

import time
from pathlib import Path

from runtime.records import read_metrics
from runtime.task_factory import TaskSource
from runtime.toy import run_toy

STEPS = 60
PROMPTS, GROUP = 8, 16
ETA = 2
SHIPPED = "runtime/data/arith_word.jsonl"


def test_grpo_raises_the_math_reward_of_a_hf_model_on_a_jsonl_data_set(tiny_hf: Path, tmp_path: Path) -> None:
    source = TaskSource(model=str(tiny_hf), dataset=SHIPPED, reward="math", max_new_tokens=1, lr=3e-3)
    t0 = time.perf_counter()
    result = run_toy(STEPS, engines=2, staleness=ETA, seed=0, out_dir=tmp_path, prompts_per_step=PROMPTS,
                     group_size=GROUP, source=source)
    wall = time.perf_counter() - t0

    curve = result.reward_curve(5)  # fifths: 8 groups a step make a tenth's mean noisy
    print(f"\nreward by fifth of the run: {[round(r, 3) for r in curve]}")
    print(f"eval before {result.eval_before:.4f}, after {result.eval_after:.4f}; best prompt-blind answer "
          f"{result.uniform_chance:.4f}; {result.samples} samples in {result.seconds:.1f} s, {wall:.1f} s in all")

    assert result.steps == STEPS and result.max_staleness <= ETA
    assert result.eval_before < 0.05  # the random model rarely answers right
    assert result.eval_after >= 3 * result.eval_before and result.eval_after - result.eval_before >= 0.05
    assert curve[-1] >= 3 * curve[0] and curve[-1] >= 0.07  # the reward the trainer saw rose with it
    metrics = read_metrics(tmp_path)
    assert [m["step"] for m in metrics] == list(range(STEPS))
    assert set(metrics[0]["response_lengths"]) == {"1"}
    assert min(map(int, metrics[0]["prompt_lengths"])) > 15  # chat-templated word problems, subword tokens
    assert wall < 240
