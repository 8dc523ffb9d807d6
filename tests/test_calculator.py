"""The calculator tool: its arithmetic parser (runtime.calculator) and its call syntax (runtime.calculator_tool)."""

from __future__ import annotations

import re
from fractions import Fraction

import pytest

from runtime.calculator import CalcError, evaluate, render
from runtime.calculator_tool import CalculatorTool


@pytest.mark.parametrize(("expression", "value"), [
    ("3*7", 21), ("12 * 7 + 1", 85), ("2+3*4", 14), ("(2+3)*4", 20), ("10-4-3", 3), ("-(2+3)*4", -20),
    ("--3", 3), ("+5", 5), ("7/2", Fraction(7, 2)), ("6/3", 2), ("8/4/2", 1), ("((1))", 1), (" 4 *( 5-2 ) ", 12),
    ("999999999999999999*2", 1999999999999999998),
])
def test_good_expressions(expression: str, value: Fraction | int) -> None:
    assert evaluate(expression) == value


@pytest.mark.parametrize(("expression", "why"), [
    ("", "empty"), ("1/0", "division by zero"), ("5/(3-3)", "division by zero"), ("2**3", "unexpected '*'"),
    ("1 2", "no operator"), ("3+", "expected a number"), ("(1", "unclosed"), ("1)", "unexpected ')'"),
    ("x", "unexpected 'x'"), ("1.5", "unexpected '.'"), ("__import__('os')", "unexpected '_'"),
    ("2^3", "unexpected '^'"), ("1" * 19, "longer than 18 digits"), ("1+" * 40 + "1", "longer than 64"),
    ("-" * 20 + "1", "nested deeper"), ("٣+1", "unexpected"),
])
def test_bad_expressions_are_refused_with_the_reason(expression: str, why: str) -> None:
    with pytest.raises(CalcError, match=re.escape(why)):
        evaluate(expression)


def test_render() -> None:
    assert render(Fraction(21)) == "21" and render(Fraction(7, 2)) == "7/2" and render(Fraction(-4, 6)) == "-2/3"


def test_the_tool_finds_the_first_complete_call_and_answers_it() -> None:
    tool = CalculatorTool()
    assert tool.find_call("so <calc>23*7</calc> and <calc>1+1</calc>") == "23*7"
    assert tool.find_call("no call here") is None
    assert tool.find_call("<calc>23*7 unclosed") is None
    assert tool.result_text("23*7") == "<result>161</result>"
    assert tool.result_text("23*") == "<result>error</result>"  # the model is told, the episode goes on
