"""A data set as a verifiable task: prompts drawn from its records, scored by a reward on their answers.

Prompts are what the model is given (`render`: the tokenizer's chat template, runtime.hf_model), so
the controller's prompt text is the key to its answer; the same prompt twice with different answers
is refused. Sampling is uniform over records (a prompt that appears twice is drawn twice as often).

A response is scored on its text whether it ended with eos or was cut at the response cap: the
reward's rules decide what counts (`math` reads the final answer, `addition` the whole response).

The evaluation set is a fixed sample of distinct prompts (seeded apart from the run, so every run on
the data set is measured on the same prompts), equally weighted. Its `uniform_chance` is the best
score a prompt-blind policy gets by always writing one answer of the evaluation set: stricter than a
uniform guess, since a data set's answers are rarely balanced.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from runtime.dataset import Record
from runtime.rewards import Reward, checked
from traces.errors import SpecError

EVAL_SEED = 20_240_601  # fixed: the evaluation prompts do not depend on the run's seed


@dataclass(frozen=True)
class DatasetTask:
    prompts: tuple[str, ...]  # rendered, one per record, in file order
    answers: dict[str, str] = field(repr=False)  # rendered prompt -> its answer
    reward_fn: Reward = field(repr=False)
    reward_spec: str  # the --reward it came from, for error lines
    max_new_tokens: int
    eval_prompts: tuple[str, ...]

    @classmethod
    def build(cls, records: Sequence[Record], render: Callable[[str], str], reward_fn: Reward, reward_spec: str,
              max_new_tokens: int, eval_size: int = 64) -> DatasetTask:
        if max_new_tokens < 1:
            raise SpecError(f"max_new_tokens {max_new_tokens}: a response needs at least one token")
        prompts = tuple(render(r.prompt) for r in records)
        answers: dict[str, str] = {}
        for rendered, record in zip(prompts, records, strict=True):
            known = answers.setdefault(rendered, record.answer)
            if known != record.answer:
                raise SpecError(f"the data set has prompt {record.prompt[:60]!r} twice, with answers {known!r} "
                                f"and {record.answer!r}; keep one")
        distinct = sorted(answers)
        random.Random(EVAL_SEED).shuffle(distinct)
        task = cls(prompts, answers, reward_fn, reward_spec, max_new_tokens, tuple(distinct[:eval_size]))
        task.reward(task.eval_prompts[0], "", False)  # a user reward that cannot score is refused before the run
        return task

    @property
    def uniform_chance(self) -> float:
        """The best mean reward over the evaluation set of one fixed response, an answer of the set."""
        candidates = sorted(set(self.answers[p] for p in self.eval_prompts))
        n = len(self.eval_prompts)
        return max(sum(self.reward(p, a, True) for p in self.eval_prompts) / n for a in candidates)

    def sample(self, rng: random.Random) -> str:
        return self.prompts[rng.randrange(len(self.prompts))]

    def eval_weights(self) -> list[tuple[str, float]]:
        return [(p, 1.0 / len(self.eval_prompts)) for p in self.eval_prompts]

    def answer(self, prompt: str) -> str:
        return self.answers[prompt]

    def reward(self, prompt: str, response: str, finished: bool) -> float:
        """The reward of `response` to `prompt` on its text (`finished` is not required; see above)."""
        return checked(self.reward_fn, self.reward_spec, response, self.answers[prompt])
