"""Import Vidur's measured profiles as rlfleet cost-table rows (traces.costmodel.tables.COLUMNS).

Reads <root>/compute/<device>/<model>/mlp.csv and <root>/network/<node>/all_reduce.csv from a copy
of Vidur's data/profiling folder, for each (GPU, model, TP) composes prefill and decode rows
(compose.py) on a grid, and tags each row's source with Vidur's repository, files and commit.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from traces.costmodel.efficiency import DEFAULT_EFFICIENCY, Efficiency
from traces.costmodel.tables import COLUMNS
from traces.costmodel.vidur.compose import PARTS, Curves, decode_rows, prefill_rows
from traces.costmodel.vidur.names import GPUS, MODELS, VidurGpu, VidurModel, catalog_pair
from traces.costmodel.vidur.operators import read_all_reduce, read_mlp
from traces.errors import SpecError

REPOSITORY = "github.com/microsoft/vidur"


@dataclass(frozen=True)
class Grid:
    """Decode: batch x mean context. Prefill: prompts x prompt length, up to max_prefill_tokens."""

    batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
    contexts: tuple[int, ...] = (128, 256, 512, 1024, 2048, 4096, 8192, 16384)
    prefill_batches: tuple[int, ...] = (1, 4, 16)
    max_prefill_tokens: int = 16384


def profiling_root(path: str | Path) -> Path:
    """Vidur's data/profiling folder: `path` itself or, in a Vidur checkout, path/data/profiling."""
    p = Path(path)
    for root in (p, p / "data" / "profiling"):
        if (root / "compute").is_dir():
            return root
    if not p.is_dir():
        raise SpecError(f"PATH {str(p)!r}: no such folder; give Vidur's data/profiling folder or a Vidur checkout")
    raise SpecError(f"PATH {str(p)!r}: no compute/ folder in it; give Vidur's data/profiling folder")


def commit_of(root: Path) -> str | None:
    """The Vidur commit `root` is checked out at, if it is inside a git work tree."""
    try:
        done = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    sha = done.stdout.strip()
    return sha if done.returncode == 0 and len(sha) == 40 else None


def pairs(root: Path, gpus: Sequence[VidurGpu] | None = None,
          models: Sequence[VidurModel] | None = None) -> list[tuple[VidurGpu, VidurModel]]:
    """The (GPU, model) pairs asked for (default: every mapped pair `root` has a table for)."""
    found = [(g, m) for g in (gpus or GPUS) for m in (models or MODELS) if _mlp(root, g, m).is_file()]
    if gpus and models and not found:
        g, m = gpus[0], models[0]
        raise SpecError(f"--model {m.folder!r} on --gpu {g.folder}: no {_mlp(root, g, m).relative_to(root)} "
                        f"under PATH; it has: {', '.join(_have(root, g)) or 'none'}")
    if not found:
        have = ", ".join(_have(root)) or "none"
        raise SpecError(f"PATH {str(root)!r}: no mlp.csv for a model rlfleet maps ({have}); check --gpu and --model")
    return found


def import_rows(root: Path, pair: tuple[VidurGpu, VidurModel], tps: Sequence[int] | None = None,
                grid: Grid = Grid(), eff: Efficiency = DEFAULT_EFFICIENCY, commit: str | None = None,
                tick: Callable[[], None] = lambda: None) -> pd.DataFrame:
    """Prefill and decode rows for one pair at each TP degree (default: every measured degree that
    has an all-reduce table and at which the weights fit the GPUs; none may), with the composition's parts."""
    vg, vm = pair
    gpu, model = catalog_pair(vg, vm)
    layers = read_mlp(_mlp(root, vg, vm), model)
    reduce_path = root / "network" / vg.network / "all_reduce.csv"
    reduces = read_all_reduce(reduce_path) if reduce_path.is_file() else {}
    usable = [t for t in sorted(layers) if t == 1 or t in reduces]
    if tps is None:
        chosen = [t for t in usable if model.weight_bytes / t <= gpu.hbm_bytes]
    else:
        chosen = list(tps)
        bad = [t for t in chosen if t not in usable]
        if bad:
            why = "no all-reduce table " + str(reduce_path.relative_to(root)) if bad[0] in layers else "no mlp rows"
            raise SpecError(f"--tp {bad[0]}: {why} for {vm.folder} on {vg.folder}; "
                            f"use --tp {','.join(map(str, usable))}")
    frames = []
    for tp in chosen:
        curves = Curves(gpu, model, layers[tp], reduces.get(tp) if tp > 1 else None)
        batches, contexts = np.array(grid.batches), np.array(grid.contexts)
        part = pd.concat([prefill_rows(curves, np.array(grid.prefill_batches), contexts, grid.max_prefill_tokens, eff),
                          decode_rows(curves, batches, contexts, eff)], ignore_index=True)
        part["source"] = _source(vg, vm, tp, commit, eff)
        frames.append(part)
        tick()
    if not frames:  # e.g. a 70B model on one 48 GB A40: nothing a run could use
        return pd.DataFrame(columns=[*COLUMNS, *PARTS])
    return pd.concat(frames, ignore_index=True)[[*COLUMNS, *PARTS]]


def _source(vg: VidurGpu, vm: VidurModel, tp: int, commit: str | None, eff: Efficiency) -> str:
    # no '#' in it: the profile-table reader treats '#' as a comment
    files = f"data/profiling/compute/{vg.folder}/{vm.folder}/mlp.csv"
    if tp > 1:
        files += f" + network/{vg.network}/all_reduce.csv"
    shapes = f" ({vm.note})" if vm.note else ""
    return (f"vidur: {REPOSITORY} @ {commit or 'commit unknown'} (MIT), {files}{shapes}; attention and KV read: "
            f"rlfleet roofline (no attention.csv); LM head: mlp_up_proj x vocab/up-width; "
            f"decode overhead {eff.decode_overhead_s:g} s: rlfleet's")


def _mlp(root: Path, gpu: VidurGpu, model: VidurModel) -> Path:
    return root / "compute" / gpu.folder / model.folder / "mlp.csv"


def _have(root: Path, gpu: VidurGpu | None = None) -> list[str]:
    pattern = f"{gpu.folder}/*/*/mlp.csv" if gpu else "*/*/*/mlp.csv"
    return sorted(str(p.parent.relative_to(root / "compute")) for p in (root / "compute").glob(pattern))
