"""The shipped arithmetic and word-problem data set, and the corpus the tiny test tokenizer is trained on.

`python -m runtime.arith_data` writes both files under runtime/data/ from fixed seeds (a test checks
that the shipped files are what this script writes). Problems are bare sums and differences ("What
is 3 + 1?"), one-step word problems ("Ann has 3 pens and gets 1 more. How many pens does Ann have
now?") and counts ("Ann has 3 pens. How many pens does Ann have?"), answers 0..8, each equally
likely: with uniform operands the commonest answer comes up most, and RL from a random model
collapses onto it (runtime.task says what that looked like on the toy task). Any prompt-blind
answer then scores about 1/9, so a policy well above that reads the prompt.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

DATA_DIR = Path(__file__).parent / "data"
DATASET_FILE = DATA_DIR / "arith_word.jsonl"
CORPUS_FILE = DATA_DIR / "tiny_corpus.txt"
MAX_ANSWER = 8
MAX_ADDEND = 4  # sums: both operands 0..4; differences: the subtrahend 0..4
NAMES = ("Ann", "Ben", "Tom", "Sue", "Max", "Eva")
THINGS = ("apple", "pen", "book", "cup", "ball", "card")
DATASET_SEED, DATASET_SIZE = 14, 1200
CORPUS_SEED, CORPUS_SIZE = 41, 600


def problem(rng: random.Random) -> tuple[str, int]:
    """One problem and its answer: the answer drawn first (uniform 0..MAX_ANSWER), then the kind and operands.

    Kinds, equally likely: a count read off the prompt ("Ann has 3 pens. How many pens does Ann
    have?"), a bare sum or difference, a one-step word problem. The counts are the easy rung a tiny
    model climbs first (the answer is the prompt's only number); the rest need both operands.
    """
    answer = rng.randint(0, MAX_ANSWER)
    name, thing = rng.choice(NAMES), rng.choice(THINGS)
    kind = rng.choice(("count", "bare", "word"))
    if kind == "count":
        return f"{name} has {answer} {thing}s. How many {thing}s does {name} have?", answer
    add = rng.random() < 0.5
    if add:
        a = rng.randint(max(0, answer - MAX_ADDEND), min(MAX_ADDEND, answer))
        b = answer - a
    else:
        b = rng.randint(0, MAX_ADDEND)
        a = answer + b
    if kind == "bare":
        return f"What is {a} {'+' if add else '-'} {b}?", answer
    if add:
        return f"{name} has {a} {thing}s and gets {b} more. How many {thing}s does {name} have now?", answer
    return f"{name} has {a} {thing}s and gives away {b}. How many {thing}s are left?", answer


def dataset(seed: int = DATASET_SEED, size: int = DATASET_SIZE) -> list[dict[str, str]]:
    rng = random.Random(seed)
    return [{"prompt": p, "answer": str(a)} for p, a in (problem(rng) for _ in range(size))]


def corpus(seed: int = CORPUS_SEED, size: int = CORPUS_SIZE) -> list[str]:
    """Worked problems (question, then a sentence with the answer): the text the tiny tokenizer learns from."""
    rng = random.Random(seed)
    lines = []
    for _ in range(size):
        prompt, answer = problem(rng)
        lines.append(f"{prompt} The answer is {answer}.")
    return lines


def dataset_text() -> str:
    return "".join(json.dumps(row) + "\n" for row in dataset())


def corpus_text() -> str:
    return "".join(line + "\n" for line in corpus())


def main() -> None:
    DATA_DIR.mkdir(exist_ok=True)
    DATASET_FILE.write_text(dataset_text(), encoding="utf-8")
    CORPUS_FILE.write_text(corpus_text(), encoding="utf-8")
    print(f"wrote {DATASET_FILE} ({DATASET_SIZE} problems) and {CORPUS_FILE} ({CORPUS_SIZE} lines)")


if __name__ == "__main__":
    main()
