"""Profiled cost tables: CSV rows of measured seconds, interpolated in log space.

Columns: gpu_type, model, stage, tp, pp, dp, batch, context, tokens, seconds, source.
Inside the measured range a query is interpolated (log seconds over log axes); outside it the
table says so, and the cost model scales the roofline to the nearest measured point.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from traces.errors import SpecError
from traces.hardware import get_gpu
from traces.io import read_user_text

if TYPE_CHECKING:  # importlib.resources.abc from Python 3.11 only
    from importlib.resources.abc import Traversable

MAX_TABLE_BYTES = 64 * 1024**2  # a measured table: far more rows than a profile run writes
MAX_AXIS = 1e12  # no axis (tokens, batch) nor a step's seconds comes near this; inf or 1e308 is a typo
COLUMNS = ("gpu_type", "model", "stage", "tp", "pp", "dp", "batch", "context", "tokens", "seconds", "source")
# What a row is keyed by (must match exactly) and what it is interpolated over.
KEYS: dict[str, tuple[str, ...]] = {
    "decode": ("tp",),
    "prefill": ("tp",),
    "train": ("dp", "tp", "pp"),
    "logprob": ("dp", "tp", "pp"),
    "sync": (),
}
AXES: dict[str, tuple[str, ...]] = {
    "decode": ("batch", "context"),
    "prefill": ("tokens",),
    "train": ("tokens",),
    "logprob": ("tokens",),
    "sync": ("batch",),  # batch = number of receiving engines
}


@dataclass(frozen=True)
class Lookup:
    """Interpolated seconds (NaN where outside the table) and, per query, the nearest row."""

    seconds: np.ndarray
    nearest_axes: dict[str, np.ndarray]
    nearest_seconds: np.ndarray


def _gpu_name(name: str) -> str:
    """A catalog type's canonical name; any other name as written: a cluster file's own GPU type
    (`gpus:`), e.g. a profile `rlfleet calibrate` wrote for it. Rows are looked up by the resolved
    type's name, so rows of a type no cluster declares are simply never used."""
    try:
        return get_gpu(name).name
    except SpecError:
        if not name.strip() or name == "nan":
            raise
        return name.strip()


def _shipped_files() -> list[Traversable]:
    root = resources.files("traces").joinpath("data", "profiles")
    return sorted((e for e in root.iterdir() if e.name.endswith(".csv")), key=lambda e: e.name)


@functools.lru_cache(maxsize=1)  # the one table, while the files' stamp is the same
def _shipped(stamp: tuple[tuple[str, int, int], ...]) -> ProfileTable:
    frames = [_read_text(e.read_text(encoding="utf-8"), e.name) for e in _shipped_files()]
    return ProfileTable.from_frame(pd.concat(frames, ignore_index=True)) if frames else ProfileTable.empty()


def _stamp(entry: object) -> tuple[int, int]:
    """(size, mtime in ns) of a shipped file; where it cannot be stat-ed, a stamp never seen twice (no caching)."""
    try:
        st = os.stat(str(entry))
    except OSError:
        return (-1, time.monotonic_ns())
    return (st.st_size, st.st_mtime_ns)


@dataclass(frozen=True)
class ProfileTable:
    frame: pd.DataFrame = field(repr=False)
    # rows() per (stage, GPU type, model): the simulator's trainer asks at every step, and a pandas
    # filter costs about a millisecond (the frame is not changed after construction)
    _rows: dict[tuple[str, str, str], pd.DataFrame] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def empty(cls) -> ProfileTable:
        return cls(pd.DataFrame(columns=list(COLUMNS)))

    @classmethod
    def from_csv(cls, *paths: str | os.PathLike[str]) -> ProfileTable:
        frames = [_read_csv(Path(p)) for p in paths]
        return cls.from_frame(pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=list(COLUMNS)))

    @classmethod
    def shipped(cls) -> ProfileTable:
        """Every CSV under traces/data/profiles/, read once per process while the files stay as they
        are (each `CostModel()` asks: re-reading them took about 40 ms, a request's or a bench
        repeat's whole budget on a small fleet). The table is never changed after construction,
        so one object can serve every cost model."""
        return _shipped(tuple((e.name, *_stamp(e)) for e in _shipped_files()))

    @classmethod
    def from_frame(cls, frame: pd.DataFrame, origin: str = "profile table") -> ProfileTable:
        missing = [c for c in COLUMNS if c not in frame.columns]
        if missing:
            raise SpecError(f"{origin}: missing columns {', '.join(missing)}; expected {','.join(COLUMNS)}")
        out = frame[list(COLUMNS)].copy()
        bad_stage = set(out["stage"]) - set(KEYS)
        if bad_stage:
            raise SpecError(f"{origin}: unknown stage {sorted(bad_stage)[0]!r}; use one of {', '.join(KEYS)}")
        for col in ("tp", "pp", "dp", "batch", "context", "tokens", "seconds"):
            out[col] = pd.to_numeric(out[col], errors="coerce").fillna(0)
        if (out["seconds"] <= 0).any():
            raise SpecError(f"{origin}: every row needs seconds > 0")
        numbers = out[["tp", "pp", "dp", "batch", "context", "tokens", "seconds"]].to_numpy(dtype=float)
        if not np.isfinite(numbers).all() or (numbers > MAX_AXIS).any():
            raise SpecError(f"{origin}: tp, pp, dp, batch, context, tokens and seconds must be finite numbers "
                            f"up to {MAX_AXIS:g}; fix the row")
        out["gpu_type"] = [_gpu_name(str(g)) for g in out["gpu_type"]]
        out["model"] = out["model"].astype(str).str.lower()
        return cls(out.reset_index(drop=True))

    def overlay(self, given: ProfileTable) -> ProfileTable:
        """These rows with `given` on top: its rows replace these for every (GPU type, model) it
        measures, rather than being averaged with them (it is the user's own hardware)."""
        measured = set(zip(given.frame["gpu_type"], given.frame["model"], strict=True))
        keep = [(g, m) not in measured for g, m in zip(self.frame["gpu_type"], self.frame["model"], strict=True)]
        frames = [f for f in (self.frame[keep], given.frame) if len(f)]
        return ProfileTable.from_frame(pd.concat(frames, ignore_index=True)) if frames else ProfileTable.empty()

    def __len__(self) -> int:
        return len(self.frame)

    def rows(self, stage: str, gpu_type: str, model: str) -> pd.DataFrame:
        key = (stage, gpu_type, model.lower())
        if key not in self._rows:
            f = self.frame
            self._rows[key] = f[(f["stage"] == stage) & (f["gpu_type"] == gpu_type) & (f["model"] == key[2])]
        return self._rows[key]

    def lookup(self, rows: pd.DataFrame, stage: str, axes: dict[str, np.ndarray]) -> Lookup:
        """Interpolate `rows` (already filtered to one key) at the query points."""
        names = AXES[stage]
        grouped = rows.groupby(list(names), as_index=False)["seconds"].mean()
        pts = np.log(np.maximum(grouped[list(names)].to_numpy(dtype=float), 1.0))
        vals = np.log(grouped["seconds"].to_numpy(dtype=float))
        query = np.log(np.maximum(np.stack([np.asarray(axes[n], float) for n in names], axis=-1), 1.0))
        flat = query.reshape(-1, len(names))
        seconds = np.exp(_interpolate(pts, vals, flat)).reshape(query.shape[:-1])
        from scipy.spatial import cKDTree  # here, not at import: scipy's spatial and interpolate take ~0.4 s

        _, idx = cKDTree(pts).query(flat)
        nearest = {n: grouped[n].to_numpy(dtype=float)[idx].reshape(query.shape[:-1]) for n in names}
        return Lookup(seconds, nearest, grouped["seconds"].to_numpy(dtype=float)[idx].reshape(query.shape[:-1]))


def _interpolate(pts: np.ndarray, vals: np.ndarray, query: np.ndarray) -> np.ndarray:
    """Linear interpolation in log space; NaN outside the measured range."""
    if pts.shape[1] == 1 or len(pts) < 3:
        return _interp_1d(pts, vals, query)
    spread = [np.unique(pts[:, j]).size for j in range(pts.shape[1])]
    if min(spread) == 1:  # measured along one axis only: 1-D on the other, exact match on this one
        fixed = int(np.argmin(spread))
        free = 1 - fixed
        out = _interp_1d(pts[:, [free]], vals, query[:, [free]])
        return np.where(np.isclose(query[:, fixed], pts[0, fixed]), out, np.nan)
    from scipy.interpolate import LinearNDInterpolator  # imported when first needed (see ProfileTable.lookup)
    from scipy.spatial import QhullError

    try:
        return LinearNDInterpolator(pts, vals)(query)
    except QhullError:
        return np.full(len(query), np.nan)


def _interp_1d(pts: np.ndarray, vals: np.ndarray, query: np.ndarray) -> np.ndarray:
    x = pts[:, 0]
    order = np.argsort(x)
    x, y = x[order], vals[order]
    q = query[:, 0]
    out = np.interp(q, x, y)
    inside = (q >= x[0] - 1e-9) & (q <= x[-1] + 1e-9)
    return np.where(inside, out, np.nan)


def _read_csv(path: Path) -> pd.DataFrame:
    if not os.path.lexists(path):
        raise SpecError(f"{path}: profile table not found (check the --profile path)")
    return _read_text(read_user_text(path, MAX_TABLE_BYTES), str(path))


def _read_text(text: str, origin: str) -> pd.DataFrame:
    from io import StringIO

    try:
        frame = pd.read_csv(StringIO(text), comment="#")
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise SpecError(f"{origin}: not a profile CSV ({str(exc).splitlines()[0]})") from None
    return ProfileTable.from_frame(frame, origin).frame
