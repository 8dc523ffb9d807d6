"""Rewards of a data-set task: built-in `math` and `addition`, or one's own as `module:function`.

A reward is `function(response: str, answer: str) -> float`: the decoded response (up to eos) and
the data set's answer field as text. Built in:

- `math`: the response's final answer (the last `\\boxed{...}`, else the last number) against the
  reference's (a GSM8K-style `#### 42` or a MATH-style `\\boxed{}` is read the same way), exact
  match after normalisation: spaces, `$`, `\\left`/`\\right`, `\\!`, `dfrac`/`tfrac` and a trailing
  period dropped, thousands commas removed, and numbers compared as exact fractions (`0.5`, `1/2`
  and `\\frac{1}{2}` agree; `5.0` equals `5`). The rules follow the spirit of the MATH benchmark's
  `strip_string` (Hendrycks et al., 2021, "Measuring Mathematical Problem Solving With the MATH
  Dataset"), trimmed to what decides small numeric answers.
- `addition`: the toy task's rule (runtime.task): the whole response, stripped, is the number.

`load_reward(spec)` refuses a name it does not know, a module that does not import and an attribute
that is not a function, each in one line (traces.SpecError).
"""

from __future__ import annotations

import importlib
import math
import numbers
import os
import re
import sys
from collections.abc import Callable
from fractions import Fraction

from traces.errors import SpecError

Reward = Callable[[str, str], float]

# a minus sign only where it cannot be subtraction ("5-2" is 5 and 2); thousands commas kept for normalize
_NUMBER = re.compile(r"(?<!\d)-?\d+(?:,\d{3})*(?:\.\d+)?(?:/\d+)?")
_FRAC = re.compile(r"\\frac\{([^{}]*)\}\{([^{}]*)\}")
_THOUSANDS = re.compile(r"^-?\d{1,3}(,\d{3})+(\.\d+)?$")


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (or `\\fbox{...}`), braces balanced; None if there is none."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth = 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None  # unclosed: a response cut mid-answer has no final answer


def final_answer(text: str) -> str | None:
    """What a response (or a reference) answers: the last boxed content, else the last number."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def reference_answer(answer: str) -> str:
    """A data set's answer field as its final answer: after GSM8K's `####`, inside a `\\boxed{}`, or whole."""
    if "####" in answer:
        return answer.rsplit("####", 1)[1].strip()
    boxed = last_boxed(answer)
    return boxed if boxed is not None else answer.strip()


def normalize(answer: str) -> str:
    text = answer.strip()
    for token in ("\\left", "\\right", "\\!", "$", " "):
        text = text.replace(token, "")
    text = text.replace("dfrac", "frac").replace("tfrac", "frac").rstrip(".")
    if _THOUSANDS.match(text):
        text = text.replace(",", "")
    return _FRAC.sub(r"\1/\2", text)


def as_number(text: str) -> Fraction | None:
    """An exact value for a plain number or a/b fraction; None for anything else (an expression, a word)."""
    try:
        value = Fraction(text)
    except (ValueError, ZeroDivisionError):
        return None
    return value


def answers_match(predicted: str, reference: str) -> bool:
    p, r = normalize(predicted), normalize(reference)
    if p == r:
        return True
    pn, rn = as_number(p), as_number(r)
    return pn is not None and rn is not None and pn == rn


def math_reward(response: str, answer: str) -> float:
    """1 when the response's final answer equals the reference's after normalisation, else 0."""
    predicted = final_answer(response)
    return 1.0 if predicted is not None and answers_match(predicted, reference_answer(answer)) else 0.0


def addition_reward(response: str, answer: str) -> float:
    """1 when the whole response is the answer (the toy task's exact rule), else 0."""
    return 1.0 if response.strip() == answer.strip() else 0.0


BUILTIN: dict[str, Reward] = {"math": math_reward, "addition": addition_reward}


def load_reward(spec: str) -> Reward:
    """A built-in reward's name, or `module:function` importable from sys.path or the working folder."""
    if spec in BUILTIN:
        return BUILTIN[spec]
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise SpecError(f"--reward {spec!r}: not a built-in ({', '.join(BUILTIN)}) nor module:function")
    # the working folder is importable, as under `python -m` (the `rlfleet` script's sys.path lacks it)
    added = os.getcwd() not in sys.path
    if added:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SpecError(f"--reward {spec!r}: module {module_name!r} does not import ({exc})") from None
    except Exception as exc:  # a module that fails on import is the user's code: one line, not its traceback
        raise SpecError(f"--reward {spec!r}: importing {module_name!r} raised {type(exc).__name__}: {exc}") from None
    finally:
        if added:
            sys.path.remove(os.getcwd())
    fn = getattr(module, attr, None)
    if fn is None or not callable(fn):
        raise SpecError(f"--reward {spec!r}: {module_name!r} has no function {attr!r}")
    return fn  # type: ignore[no-any-return]


def checked(reward: Reward, spec: str, response: str, answer: str) -> float:
    """The reward's value as a finite float; a user function that returns anything else is refused in one line."""
    value = reward(response, answer)
    if not isinstance(value, numbers.Real) or not math.isfinite(value):  # bool and numpy scalars are Real
        raise SpecError(f"--reward {spec!r} returned {value!r} for answer {answer!r}; it must return a finite number")
    return float(value)
