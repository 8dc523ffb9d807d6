"""The `rlfleet` command line. Each sub-command lives in planner/commands/<name>.py.

Bad input never shows a traceback: SpecError (and argparse errors) print one line and exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from traces.errors import SpecError
from traces.progress import set_quiet

EXIT_BAD_INPUT = 2


class _Parser(argparse.ArgumentParser):
    """argparse, but its errors are one line (no usage dump) and exit 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: error: {message} (see {self.prog} --help)\n")
        raise SystemExit(EXIT_BAD_INPUT)


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive finite number, got {text}")
    return value


def emit(obj: dict[str, Any], as_json: bool, lines: Sequence[str]) -> None:
    """Print one JSON object (machine-readable) or human lines."""
    if as_json:
        print(json.dumps(obj, sort_keys=True, default=_json_default))
    else:
        print("\n".join(lines))


def _json_default(value: Any) -> Any:
    import numpy as np

    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def add_profile_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", action="append", default=[], metavar="CSV",
                   help="measured cost table (from `rlfleet profile`), used before the shipped ones; repeatable")


def cost_model(args: argparse.Namespace) -> Any:
    """The cost model: the shipped profile tables, overlaid with any `--profile` CSVs (ProfileTable.overlay)."""
    from traces import CostModel, ProfileTable

    if not args.profile:
        return CostModel()
    return CostModel(ProfileTable.shipped().overlay(ProfileTable.from_csv(*args.profile)))


def build_parser() -> argparse.ArgumentParser:
    from planner.commands import catalog, costs, export, fidelity, plan, profile, report, run, simulate, validate

    parser = _Parser(
        prog="rlfleet",
        description="Simulate, plan and run RL post-training of LLMs on a mixed GPU fleet.",
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND")
    for module in (catalog, costs, validate, simulate, plan, export, report, profile, run, fidelity):
        module.register(sub)
    for command in sub.choices.values():
        command.add_argument("--quiet", action="store_true", help="no progress bars")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    set_quiet(args.quiet)
    try:
        return int(args.handler(args) or 0)
    except SpecError as exc:
        sys.stderr.write(f"rlfleet: error: {exc}\n")
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        sys.stderr.write("rlfleet: interrupted\n")
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
