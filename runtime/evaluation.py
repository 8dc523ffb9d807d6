"""How well a policy does: its expected reward on the task's evaluation prompts, sampled as it is trained."""

from __future__ import annotations

from transformers import PreTrainedModel

from runtime.contracts import Task, Tokenizer
from runtime.engine import Request, TorchEngine, generate


def evaluate(model: PreTrainedModel, task: Task, tokenizer: Tokenizer, samples_per_prompt: int = 16,
             seed: int = 12345) -> float:
    """Expected reward under the task's prompt distribution, every prompt sampled at temperature 1.

    Sampled rather than greedy: this is the policy being trained, and its chance level is defined
    the same way.
    """
    engine = TorchEngine(model, tokenizer.eos_id, tokenizer.pad_id, name="eval", max_batch=1024, seed=seed)
    weighted = task.eval_weights()
    requests = [Request(i * samples_per_prompt + j, tuple(tokenizer.encode(p)), task.max_new_tokens)
                for i, (p, _) in enumerate(weighted) for j in range(samples_per_prompt)]
    total = 0.0
    for c in generate(engine, requests):
        prompt, weight = weighted[c.sid // samples_per_prompt]
        total += weight * task.reward(prompt, tokenizer.decode(c.tokens), c.finished)
    return total / samples_per_prompt
