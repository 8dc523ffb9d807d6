"""A verifiable toy task: single-digit addition with an exact-match reward.

Prompt "3+4=", answer "7"; "9+8=" gives "17". The model must write the decimal answer and stop
(eos) within `max_new_tokens`; anything else, including a right answer followed by more digits,
earns 0.

Prompts are drawn *answer-balanced*: first a sum uniformly in 0..2m (operands 0..m), then operands
with that sum. With uniform operands instead, "9" is the answer to 10% of prompts, and RL from a
random model collapses onto answering "9" whatever the question (measured: 10% reward, flat).
Balanced, every answer that ignores the prompt scores exactly 1 / (2m + 1) (1/19 for m = 9), which
is also what a uniformly random answer scores: the `uniform_chance`. Beating it needs the operands.
An untrained model does far worse than that (it rarely even writes digits then eos), so a learning
claim is stated against the larger of the two.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class AdditionTask:
    max_operand: int = 9

    @property
    def max_new_tokens(self) -> int:
        return len(str(2 * self.max_operand)) + 1  # the longest answer, then eos

    @property
    def uniform_chance(self) -> float:
        """Mean reward of answering a uniform random number in the answer range."""
        return 1.0 / (2 * self.max_operand + 1)

    def prompts(self) -> list[str]:
        """Every prompt once."""
        m = self.max_operand
        return [f"{a}+{b}=" for a in range(m + 1) for b in range(m + 1)]

    def eval_weights(self) -> list[tuple[str, float]]:
        """Every prompt with its probability under `sample`: a weighted mean is the expected reward."""
        m = self.max_operand
        ways = {s: min(s, 2 * m - s) + 1 for s in range(2 * m + 1)}  # operand pairs with sum s
        return [(p, 1.0 / (len(ways) * ways[int(self.answer(p))])) for p in self.prompts()]

    def sample(self, rng: random.Random) -> str:
        m = self.max_operand
        total = rng.randint(0, 2 * m)
        a = rng.randint(max(0, total - m), min(m, total))
        return f"{a}+{total - a}="

    def answer(self, prompt: str) -> str:
        left, right = prompt.rstrip("=").split("+")
        return str(int(left) + int(right))

    def reward(self, prompt: str, response: str, finished: bool) -> float:
        """1 for the exact answer closed by eos, else 0."""
        return 1.0 if finished and response == self.answer(prompt) else 0.0
