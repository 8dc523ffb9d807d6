"""The multi-turn toy environment's tool: a calculator the model calls by writing `<calc>EXPR</calc>`.

A turn whose text holds a call (the first `<calc>...</calc>` in it) ends with the tool's answer
appended to the episode's context as `<result>VALUE</result>` (or `<result>error</result>` for an
expression runtime.calculator refuses: the model is told, as a real tool would tell it, and the
episode goes on). A turn without a call is the episode's final answer. The markers are plain text,
so any tokenizer that can write them takes part (runtime.tiny_hf's tool corpus teaches its BPE them).
"""

from __future__ import annotations

from dataclasses import dataclass

from runtime.calculator import CalcError, evaluate, render

CALL_OPEN, CALL_CLOSE = "<calc>", "</calc>"
RESULT_OPEN, RESULT_CLOSE = "<result>", "</result>"
ERROR = "error"


@dataclass(frozen=True)
class CalculatorTool:
    name: str = "calculator"

    def find_call(self, text: str) -> str | None:
        """The expression of the first complete call in `text`, or None (no call: a final answer)."""
        start = text.find(CALL_OPEN)
        if start < 0:
            return None
        end = text.find(CALL_CLOSE, start + len(CALL_OPEN))
        return None if end < 0 else text[start + len(CALL_OPEN):end]

    def answer(self, expression: str) -> str:
        """The value the tool returns for `expression` (ERROR if the calculator refuses it)."""
        try:
            return render(evaluate(expression))
        except CalcError:
            return ERROR

    def result_text(self, expression: str) -> str:
        """What the tool's answer adds to the context."""
        return f"{RESULT_OPEN}{self.answer(expression)}{RESULT_CLOSE}"
