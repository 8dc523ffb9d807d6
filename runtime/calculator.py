"""The calculator tool's arithmetic: integers with + - * / and parentheses, parsed here, never eval'd.

A recursive-descent parser over the grammar
    expr   := term (('+' | '-') term)*
    term   := factor (('*' | '/') factor)*
    factor := ('+' | '-') factor | integer | '(' expr ')'
evaluated in exact rationals (`fractions.Fraction`), so 7/2 is 7/2 and 6/3 is 2. Anything else (a
name, a float, `**`, an unclosed parenthesis, division by zero, an expression too long or nested too
deep) is a `CalcError` with what is wrong: model text is untrusted input.
"""

from __future__ import annotations

import re
from fractions import Fraction

MAX_CHARS = 64  # a tool call longer than this is not arithmetic a toy task needs
MAX_DEPTH = 16  # nested parentheses / unary signs: the parser recurses once per level
MAX_DIGITS = 18  # per integer literal


class CalcError(ValueError):
    """The expression is not one the calculator takes (the message says why)."""


def evaluate(expression: str) -> Fraction:
    """The exact value of `expression`; CalcError if it is not integer arithmetic of + - * / ( )."""
    if len(expression) > MAX_CHARS:
        raise CalcError(f"expression longer than {MAX_CHARS} characters")
    if re.search(r"\d\s+\d", expression):  # "1 2" is not 12
        raise CalcError("two numbers with no operator between them")
    parser = _Parser(re.sub(r"\s+", "", expression))
    value = parser.expr(0)
    if parser.pos != len(parser.text):
        raise CalcError(f"unexpected {parser.text[parser.pos]!r} at position {parser.pos}")
    return value


def render(value: Fraction) -> str:
    """An integer as itself, else p/q in lowest terms."""
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


class _Parser:
    def __init__(self, text: str) -> None:
        if not text:
            raise CalcError("empty expression")
        self.text, self.pos = text, 0

    def _peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def expr(self, depth: int) -> Fraction:
        value = self.term(depth)
        while self._peek() in ("+", "-"):
            op = self.text[self.pos]
            self.pos += 1
            right = self.term(depth)
            value = value + right if op == "+" else value - right
        return value

    def term(self, depth: int) -> Fraction:
        value = self.factor(depth)
        while self._peek() in ("*", "/"):
            op = self.text[self.pos]
            self.pos += 1
            right = self.factor(depth)
            if op == "/" and right == 0:
                raise CalcError("division by zero")
            value = value * right if op == "*" else value / right
        return value

    def factor(self, depth: int) -> Fraction:
        if depth > MAX_DEPTH:
            raise CalcError(f"nested deeper than {MAX_DEPTH} levels")
        ch = self._peek()
        if ch in ("+", "-"):
            self.pos += 1
            inner = self.factor(depth + 1)
            return inner if ch == "+" else -inner
        if ch == "(":
            self.pos += 1
            value = self.expr(depth + 1)
            if self._peek() != ")":
                raise CalcError("unclosed parenthesis" if not self._peek()
                                else f"expected ')' at position {self.pos}, got {self._peek()!r}")
            self.pos += 1
            return value
        start = self.pos
        while self._peek().isascii() and self._peek().isdigit():
            self.pos += 1
        if start == self.pos:
            raise CalcError("expected a number at the end" if not ch else f"unexpected {ch!r} at position {start}")
        if self.pos - start > MAX_DIGITS:
            raise CalcError(f"a number longer than {MAX_DIGITS} digits")
        return Fraction(int(self.text[start:self.pos]))
