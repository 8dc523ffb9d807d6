"""What every `rlfleet` sub-command shares: the one-line-error parser, argument types, output and the cost model.

Commands import this module, never planner/cli.py (which imports every command): no import circle.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

EXIT_BAD_INPUT = 2


class Parser(argparse.ArgumentParser):
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


# --seed: a whole number in [0, 2**63 - 1] (numpy and torch seeds both take it).
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


def int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive whole numbers, got {text!r}")
    return values


def ray_address(text: str) -> str:
    """argparse type for a Ray address (traces.ray_address): a bad one is one line naming the forms."""
    from traces.errors import SpecError
    from traces.ray_address import check_ray_address

    try:
        return check_ray_address(text)
    except SpecError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_executor_args(p: argparse.ArgumentParser, what: str) -> None:
    """--executor and --ray-address: where `what` runs (planner.executors)."""
    p.add_argument("--executor", choices=("auto", "serial", "processes", "ray"), default=None,
                   help=f"where {what} run: serial (this process), processes (local processes), ray (Ray tasks); "
                        "default auto: processes when more than one core, ray with --ray-address")
    p.add_argument("--ray-address", type=ray_address, metavar="HOST:PORT",
                   help="the Ray cluster for --executor ray (host:port, ray://host:port, auto); default: a new "
                        "local Ray on loopback")
