"""The `rlfleet` command line. Each sub-command lives in planner/commands/<name>.py.

Bad input never shows a traceback: SpecError (and argparse errors) print one line and exit 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from planner.commands.args import EXIT_BAD_INPUT, Parser
from traces.errors import SpecError
from traces.os_errors import os_error_line
from traces.progress import set_quiet


def build_parser() -> argparse.ArgumentParser:
    from planner.commands import (
        calibrate,
        catalog,
        costs,
        export,
        fidelity,
        plan,
        profile,
        report,
        run,
        simulate,
        validate,
    )

    parser = Parser(
        prog="rlfleet",
        description="Simulate, plan and run RL post-training of LLMs on a mixed GPU fleet.",
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser, metavar="COMMAND")
    for module in (catalog, costs, validate, simulate, plan, export, report, profile, run, fidelity, calibrate):
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
    except OSError as exc:  # a path the code did not check itself: one line by kind (traces.os_errors)
        sys.stderr.write(f"rlfleet: error: {os_error_line(exc)}\n")
        return EXIT_BAD_INPUT
    except OverflowError as exc:  # a whole-number flag without an upper bound, too large for numpy
        sys.stderr.write(f"rlfleet: error: a number is too large ({exc}); give smaller values\n")
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    raise SystemExit(main())
