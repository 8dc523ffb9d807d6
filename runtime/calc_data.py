"""The calculator task's data set and the tool corpus a tiny tokenizer learns the tool's markers from.

Problems are products, sums and differences of a two-digit and a one-digit number ("What is 23 * 7?"),
answers exact integers: too hard for a tiny model to do in its head, one `<calc>23*7</calc>` call away
with the tool (runtime.calculator_tool). The corpus (worked episodes: the question, the call, the
tool's result, the answer) is added to the tiny tokenizer's training text by `runtime.tiny_hf
--tools`, so its BPE can write the markers (a byte-level BPE trained on the arithmetic corpus alone
has no '<' to write them with). `python -m runtime.calc_data` writes the shipped data set (a test
checks the file is what this script writes).
"""

from __future__ import annotations

import json
import random

from runtime.arith_data import DATA_DIR
from runtime.calculator_tool import CALL_CLOSE, CALL_OPEN, ERROR, RESULT_CLOSE, RESULT_OPEN

DATASET_FILE = DATA_DIR / "calc.jsonl"
DATASET_SEED, DATASET_SIZE = 23, 600
CORPUS_SEED, CORPUS_SIZE = 29, 300
OPS = ("*", "+", "-")


def problem(rng: random.Random) -> tuple[str, str, int]:
    """(prompt, the expression a call would compute, the answer)."""
    a, b, op = rng.randint(10, 49), rng.randint(2, 9), rng.choice(OPS)
    expression = f"{a}{op}{b}"
    answer = a * b if op == "*" else a + b if op == "+" else a - b
    return f"What is {a} {op} {b}?", expression, answer


def dataset(seed: int = DATASET_SEED, size: int = DATASET_SIZE) -> list[dict[str, str]]:
    rng = random.Random(seed)
    return [{"prompt": p, "answer": str(v)} for p, _, v in (problem(rng) for _ in range(size))]


def tool_corpus(seed: int = CORPUS_SEED, size: int = CORPUS_SIZE) -> list[str]:
    """Worked episodes, and the tool's error reply, as text."""
    rng = random.Random(seed)
    lines = []
    for _ in range(size):
        prompt, expression, answer = problem(rng)
        lines.append(f"{prompt} {CALL_OPEN}{expression}{CALL_CLOSE}{RESULT_OPEN}{answer}{RESULT_CLOSE} "
                     f"The answer is {answer}.")
    lines.append(f"{CALL_OPEN}1/0{CALL_CLOSE}{RESULT_OPEN}{ERROR}{RESULT_CLOSE}")
    return lines


def dataset_text() -> str:
    return "".join(json.dumps(row) + "\n" for row in dataset())


def main() -> None:
    DATA_DIR.mkdir(exist_ok=True)
    DATASET_FILE.write_text(dataset_text(), encoding="utf-8")
    print(f"wrote {DATASET_FILE} ({DATASET_SIZE} problems)")


if __name__ == "__main__":
    main()
