"""Progress bars for long work: shown on a terminal, silent under --quiet or when stderr is not a TTY."""

from __future__ import annotations

import sys
from typing import Any

from tqdm import tqdm

_quiet = False


def set_quiet(quiet: bool) -> None:
    """The CLI's --quiet: no bars anywhere in this process."""
    global _quiet
    _quiet = quiet


def bar(total: int | None, desc: str, unit: str = "it") -> Any:
    """A tqdm bar on stderr, disabled when quiet or not on a terminal (logs and pipes stay clean)."""
    return tqdm(total=total, desc=desc, unit=unit, leave=False, file=sys.stderr,
                disable=_quiet or not sys.stderr.isatty(), dynamic_ncols=True)
