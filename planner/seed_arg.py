"""The `--seed` argument type: a whole number in [0, 2**63 - 1] (numpy and torch seeds both take it)."""

from __future__ import annotations

import argparse

MAX_SEED = 2**63 - 1


def non_negative_seed(text: str) -> int:
    """argparse type for --seed; a bad one is one line naming the fix (exit 2)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number from 0 to {MAX_SEED}, got {text!r}") from None
    if not 0 <= value <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"must be from 0 to {MAX_SEED}, got {value}")
    return value
