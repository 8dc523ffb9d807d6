"""stdout silenced while MILP solves run: highspy prints its banner on stdout before PuLP can silence it."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator

_QUIET = threading.Lock()
_quiet_state: list[int] = [0, -1]  # solves now silenced, and the real stdout's saved descriptor


@contextlib.contextmanager
def quiet_stdout() -> Iterator[None]:
    """stdout to /dev/null while solves run; solves in threads (Search.solve_many) share one
    redirection, restored when the last ends (each restoring its own would leave /dev/null)."""
    with _QUIET:
        if _quiet_state[0] == 0:
            sys.stdout.flush()
            _quiet_state[1] = os.dup(1)
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 1)
            os.close(null)
        _quiet_state[0] += 1
    try:
        yield
    finally:
        with _QUIET:
            _quiet_state[0] -= 1
            if _quiet_state[0] == 0:
                os.dup2(_quiet_state[1], 1)
                os.close(_quiet_state[1])
