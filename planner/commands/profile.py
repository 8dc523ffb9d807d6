"""`rlfleet profile`: measure this machine's stage costs into a cost table (runtime.profile).

`rlfleet profile import` brings in profiles measured elsewhere instead (profile_import.py).

The CSV has the traces profile-table columns, rows tagged `measured: ...`; give it to `simulate`,
`plan`, `run` or `fidelity` with `--profile FILE`, or drop it under traces/data/profiles/ to ship it.
"""

from __future__ import annotations

import argparse
from typing import Any

from planner.commands.args import emit, int_list, positive_int
from traces import SpecError, get_gpu, get_model
from traces.io import atomic_write_text, check_target
from traces.progress import bar


def register(sub: Any) -> None:
    p = sub.add_parser("profile", help="measure prefill, decode, train, logprob and sync costs on this machine "
                       "(or import measured ones: profile import)")
    p.add_argument("--model", help="catalog model whose shapes to build with random weights "
                   "(e.g. tiny-llama; see `rlfleet catalog`)")
    p.add_argument("--gpu-type", help="the catalog type to file the rows under (CPU on a CPU host)")
    p.add_argument("--out", metavar="CSV", help="write the rows here (default profile-<TYPE>-<MODEL>.csv)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default cpu; cuda is untested)")
    p.add_argument("--batches", type=int_list, default=None, help="engine batch sizes, e.g. 1,4,16,64,256")
    p.add_argument("--contexts", type=int_list, default=None, help="prompt lengths, e.g. 4,16,48")
    p.add_argument("--train-tokens", type=int_list, default=None, help="tokens per train step, e.g. 256,1024,4096")
    p.add_argument("--seq-len", type=positive_int, default=None, help="tokens per training sequence (default 8)")
    p.add_argument("--sync-engines", type=int_list, default=None, help="receiving engines for sync, e.g. 1,2")
    p.add_argument("--repeats", type=positive_int, default=None, help="timed repeats per point (default 3)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=run)
    from planner.commands import profile_import  # here: only `profile` uses it

    profile_import.register(p.add_subparsers(dest="action", metavar="ACTION", parser_class=type(p),
                                             help="import: profiles measured elsewhere (none: measure this machine)"))


def run(args: argparse.Namespace) -> int:
    if not args.model or not args.gpu_type:
        raise SpecError("rlfleet profile needs --model and --gpu-type to measure this machine "
                        "(or `rlfleet profile import --format vidur PATH` to import measured profiles)")
    spec, gpu = get_model(args.model), get_gpu(args.gpu_type)
    try:
        import torch

        from runtime.profile import Grid, profile
    except ImportError as exc:
        raise SpecError(f"rlfleet profile needs the runtime extra ({exc.name} is missing): "
                        "pip install -e '.[runtime]'") from None
    given = {"batches": args.batches, "contexts": args.contexts, "train_tokens": args.train_tokens,
             "seq_len": args.seq_len, "sync_engines": args.sync_engines, "repeats": args.repeats}
    grid = Grid(**{k: v for k, v in given.items() if v is not None})
    grid.check()
    torch.set_num_threads(1)  # what one runtime process gets: engines and trainer run one thread each
    out = args.out or f"profile-{gpu.name}-{spec.name}.csv"
    check_target(out)  # before the measurements, not after
    with bar(grid.points, f"profiling {spec.name} on {gpu.name}", unit="shape") as progress:
        rows = profile(spec, gpu.name, grid, args.device, tick=progress.update)
    atomic_write_text(out, rows.to_csv(index=False))
    counts = rows["stage"].value_counts().to_dict()
    emit({"out": out, "rows": len(rows), "stages": counts, "gpu_type": gpu.name, "model": spec.name},
         args.json, [
             f"profiled {spec.name} on {gpu.name}: {len(rows)} rows "
             f"({', '.join(f'{k} {v}' for k, v in sorted(counts.items()))}) -> {out}",
             f"  use it: rlfleet simulate ... --profile {out}",
         ])
    return 0
