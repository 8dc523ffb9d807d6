"""What a run needs from its task and its tokenizer: the toy's (runtime.task, runtime.model) and a real
model's data set (runtime.data_task, runtime.hf_model) both fit, so the loops, the controller and the
evaluation take either."""

from __future__ import annotations

import random
from typing import Protocol


class Tokenizer(Protocol):
    @property
    def pad_id(self) -> int: ...
    @property
    def eos_id(self) -> int: ...
    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: list[int] | tuple[int, ...]) -> str: ...  # the text up to the first eos
    def save(self, folder: str) -> None: ...  # beside the model, as AutoTokenizer loads it


class Task(Protocol):
    """A verifiable task: prompts to sample, a response cap, a reward, and its evaluation set."""

    @property
    def max_new_tokens(self) -> int: ...
    @property
    def uniform_chance(self) -> float:
        """What a policy blind to the prompt scores: a learning claim is stated against it."""
        ...
    def sample(self, rng: random.Random) -> str: ...
    def eval_weights(self) -> list[tuple[str, float]]: ...  # prompts and weights summing to 1
    def reward(self, prompt: str, response: str, finished: bool) -> float: ...
