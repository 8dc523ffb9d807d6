"""`rlfleet profile import --format vidur PATH`: measured GPU profiles from elsewhere, as a cost table.

PATH is a copy of Vidur's data/profiling folder (or a Vidur checkout); see traces.costmodel.vidur
for how its operator tables become prefill and decode rows, and what is priced by the roofline.
"""

from __future__ import annotations

import argparse
from typing import Any

import pandas as pd

from planner.commands.args import emit, int_list, positive_int
from traces import SpecError
from traces.costmodel.tables import COLUMNS
from traces.io import atomic_write_text
from traces.progress import bar

FORMATS = ("vidur",)


def _names(text: str) -> tuple[str, ...]:
    values = tuple(v.strip() for v in text.split(",") if v.strip())
    if not values:
        raise argparse.ArgumentTypeError(f"expected comma-separated names, got {text!r}")
    return values


def register(actions: Any) -> None:
    p = actions.add_parser("import", help="import measured profiles (Vidur's data/profiling) as a cost table")
    p.add_argument("path", metavar="PATH", help="Vidur's data/profiling folder, or a Vidur checkout")
    p.add_argument("--format", dest="fmt", metavar="FORMAT", help="the profiles' format: vidur")
    p.add_argument("--out", metavar="CSV", default="profile-vidur.csv", help="write the rows here "
                   "(default profile-vidur.csv; under traces/data/profiles/ the cost model ships them)")
    p.add_argument("--gpu", type=_names, default=None, help="GPU types, Vidur's (a100) or the catalog's "
                   "(A100-80G), comma-separated (default: every one PATH has)")
    p.add_argument("--model", type=_names, default=None, help="models, Vidur's (meta-llama/Meta-Llama-3-8B) "
                   "or the catalog's (llama-3.1-8b), comma-separated (default: every mapped one)")
    p.add_argument("--tp", type=int_list, default=None, help="TP degrees, e.g. 1,2,4,8 (default: each measured "
                   "one with an all-reduce table at which the weights fit)")
    p.add_argument("--commit", help="the Vidur commit PATH comes from, for the rows' source (default: git's, if any)")
    p.add_argument("--batches", type=int_list, default=None, help="decode batch sizes (default 1,2,4,...,512)")
    p.add_argument("--contexts", type=int_list, default=None,
                   help="decode mean contexts and prompt lengths (default 128,256,...,16384)")
    p.add_argument("--prefill-batches", type=int_list, default=None, help="prompts per prefill (default 1,4,16)")
    p.add_argument("--max-prefill-tokens", type=positive_int, default=None, help="largest prefill (default 16384)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.fmt is None:
        raise SpecError("--format is missing: rlfleet profile import --format vidur PATH")
    if args.fmt.lower() not in FORMATS:
        raise SpecError(f"--format {args.fmt!r}: unknown profile format; use --format {' or '.join(FORMATS)}")
    from traces.costmodel import vidur  # here: only this action needs it

    root = vidur.profiling_root(args.path)
    gpus = [vidur.vidur_gpu(g) for g in args.gpu] if args.gpu else None
    models = [vidur.vidur_model(m) for m in args.model] if args.model else None
    given = {"batches": args.batches, "contexts": args.contexts, "prefill_batches": args.prefill_batches,
             "max_prefill_tokens": args.max_prefill_tokens}
    grid = vidur.Grid(**{k: v for k, v in given.items() if v is not None})
    commit = args.commit or vidur.commit_of(root)
    todo = vidur.pairs(root, gpus, models)
    frames, skipped = [], []
    with bar(len(todo), "importing Vidur profiles", unit="table") as progress:
        for pair in todo:
            rows = vidur.import_rows(root, pair, args.tp, grid, commit=commit)
            if rows.empty:
                skipped.append(f"{pair[1].folder} on {pair[0].folder}")
            frames.append(rows)
            progress.update()
    out = pd.concat([f for f in frames if len(f)] or frames, ignore_index=True)[list(COLUMNS)]
    if out.empty:
        raise SpecError(f"no rows: the weights fit no measured TP degree ({'; '.join(skipped)}); ask for one with --tp")
    atomic_write_text(args.out, out.to_csv(index=False, float_format="%.6g"))
    tables = sorted({f"{g} {m}" for g, m in zip(out["gpu_type"], out["model"], strict=True)})
    emit({"out": args.out, "rows": len(out), "tables": tables, "skipped": skipped, "commit": commit},
         args.json, [
             f"imported {len(out)} rows from Vidur ({', '.join(tables)}) -> {args.out}",
             *([f"  skipped (the weights fit no measured TP degree): {', '.join(skipped)}"] if skipped else []),
             f"  use it: rlfleet simulate ... --profile {args.out}",
         ])
    return 0
