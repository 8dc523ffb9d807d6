"""The one error type for bad user input.

Every message names the offending field (or file and line) and the fix, so the
CLI can print it on one line and exit with status 2 instead of a traceback.
"""

from __future__ import annotations


class SpecError(ValueError):
    """Invalid input: the message says what is wrong and how to fix it."""


def did_you_mean(name: str, known: list[str]) -> str:
    """A hint listing the known names, closest first."""
    import difflib

    close = difflib.get_close_matches(name.lower(), [k.lower() for k in known], n=3, cutoff=0.5)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    return f"{hint}; known: {', '.join(sorted(known))}"
