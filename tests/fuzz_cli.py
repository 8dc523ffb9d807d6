"""Running the CLI in-process for fuzz tests: a wall-clock bound per call, and the one-line check.

Shared by tests/test_fuzz.py and tests/test_paths.py (imported as `fuzz_cli`: tests/ is on the
path). TRIED and SUCCEEDED count every call, so the fuzz file's last test can report (and check)
how many inputs were tried.
"""

from __future__ import annotations

import json
import math
import signal
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from planner.cli import main

SECONDS_PER_CALL = 60
TRIED: Counter[str] = Counter()
SUCCEEDED: Counter[str] = Counter()  # exit 0 with sane output: valid inputs were exercised too


class Hang(Exception):
    pass


@contextmanager
def alarm(seconds: int) -> Iterator[None]:
    def ring(_signum: int, _frame: Any) -> None:
        raise Hang(f"CLI call ran past {seconds} s")

    old = signal.signal(signal.SIGALRM, ring)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def run(capsys: pytest.CaptureFixture[str], argv: list[str], seconds: int = SECONDS_PER_CALL) -> tuple[int, str, str]:
    """main(argv) in this process, bounded by `seconds`: (exit code, stdout, stderr)."""
    TRIED[argv[0]] += 1
    with alarm(seconds):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def check(code: int, out: str, err: str, argv: list[str]) -> dict[str, Any] | None:
    """Exit 2 with exactly one `rlfleet...` line on stderr and nothing on stdout, or exit 0 (the JSON
    answer, with --json); never a traceback."""
    assert "Traceback" not in err and "Traceback" not in out, (argv, err)
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("rlfleet"), (argv, err)
        assert out == "", (argv, out)
        return None
    assert code == 0, (argv, code, err)
    SUCCEEDED[argv[0]] += 1
    return json.loads(out) if "--json" in argv else None


def finite(obj: Any) -> bool:
    """No NaN anywhere in a JSON answer (inf is allowed: an unbounded figure is honest)."""
    if isinstance(obj, dict):
        return all(finite(v) for v in obj.values())
    if isinstance(obj, list):
        return all(finite(v) for v in obj)
    return not isinstance(obj, float) or math.isfinite(obj)
