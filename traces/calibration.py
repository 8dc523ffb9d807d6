"""The calibration set: public measurements, one cited row each, that the cost model may be fitted to.

Rows live in ``traces/data/calibration/<kind>.csv`` (columns in that folder's README.md). The sources
the fidelity issue reserves for judging the model from outside are not in the set (K6's one row
aside, which the issue allows).
"""

from __future__ import annotations

import csv
import io
import os
from datetime import date
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from traces.errors import SpecError
from traces.io import data_files, data_text, read_user_text, validate

_FROZEN = ConfigDict(frozen=True, extra="forbid")

# What each kind of row may measure; the unit names say the unit.
UNITS: dict[str, frozenset[str]] = {
    "decode": frozenset({"output_tok_per_s", "ms_per_token"}),
    "prefill": frozenset({"ttft_ms", "prefill_tok_per_s"}),
    "serve": frozenset({"output_tok_per_s"}),
    "train": frozenset({"mfu", "tok_per_s_per_gpu", "tflops_per_gpu", "step_s"}),
    "rl_step": frozenset({"step_s", "gen_s", "logprob_s", "train_s", "sync_s", "tok_per_s_per_gpu"}),
    "sync": frozenset({"sync_s"}),
    "kernel": frozenset({"tflops", "tb_per_s"}),
}
Kind = Literal["decode", "prefill", "serve", "train", "rl_step", "sync", "kernel"]
_COUNT = Field(default=None, ge=1)


class CalibrationRow(BaseModel):
    """One public measurement with the setup needed to reproduce it."""

    model_config = _FROZEN

    id: str = Field(pattern=r"^[KC][0-9]+$")
    kind: Kind
    model: str = Field(min_length=1)
    precision: str = Field(min_length=1)
    gpu_type: str = Field(min_length=1)
    gpus: int = Field(ge=1)
    layout: str = Field(min_length=1)
    mode: Literal["colocated", "disaggregated"] | None = None
    engine: str = Field(min_length=1)
    batch: int | None = _COUNT
    prompt_len: int | None = _COUNT
    output_len: int | None = _COUNT
    seq_len: int | None = _COUNT
    tokens_per_step: int | None = _COUNT
    group_size: int | None = _COUNT
    value: float = Field(gt=0)
    unit: str
    run: str | None = None
    source: str = Field(min_length=1)
    source_key: str = Field(pattern=r"^[a-z0-9][a-z0-9.-]*$")
    where: str = Field(min_length=1)
    read_on: date
    notes: str = ""

    @model_validator(mode="after")
    def _unit_fits_kind(self) -> CalibrationRow:
        if self.unit not in UNITS[self.kind]:
            units = ", ".join(sorted(UNITS[self.kind]))
            raise ValueError(f"'{self.unit}' is not a {self.kind} unit; use one of {units}")
        if self.unit == "mfu" and self.value > 1:
            raise ValueError(f"mfu {self.value} is above 1; give it as a fraction of peak")
        if self.kind == "rl_step" and self.mode is None:
            raise ValueError("an rl_step row needs mode; set it to colocated or disaggregated")
        return self


def parse_calibration_csv(text: str, origin: str) -> tuple[CalibrationRow, ...]:
    """Rows of one CSV file; a file named <kind>.csv may hold only that kind."""
    kind = Path(origin).stem
    rows = []
    for line, record in enumerate(csv.DictReader(io.StringIO(text)), start=2):
        if None in record:  # DictReader files surplus cells under the key None
            raise SpecError(f"{origin}:{line}: more cells than header columns; quote cells that hold commas")
        # An empty cell is an absent field: optional ones take their default, required ones are reported missing.
        fields = {k: v.strip() for k, v in record.items() if isinstance(v, str) and v.strip()}
        row = validate(CalibrationRow, fields, f"{origin}:{line} ({fields.get('id') or 'no id'})")
        if kind in UNITS and row.kind != kind:
            raise SpecError(f"{origin}:{line} ({row.id}): field 'kind': {row.kind} row in {kind}.csv; "
                            f"move it to {row.kind}.csv")
        rows.append(row)
    return tuple(rows)


def load_calibration(path: str | os.PathLike[str] | None = None) -> tuple[CalibrationRow, ...]:
    """The shipped set (no path), or the rows of a CSV file or of every CSV in a folder."""
    if path is None:
        texts = [(f"calibration/{name}", data_text(f"calibration/{name}"))
                 for name in data_files("calibration") if name.endswith(".csv")]
    else:
        p = Path(path)
        files = sorted(p.glob("*.csv")) if p.is_dir() else [p]
        if not files:
            raise SpecError(f"{p}: no .csv files in this folder; give a calibration CSV or a folder of them")
        texts = [(str(f), read_user_text(f)) for f in files]
    rows: list[CalibrationRow] = []
    seen: dict[str, str] = {}
    for origin, text in texts:
        for row in parse_calibration_csv(text, origin):
            if row.id in seen:
                raise SpecError(f"{origin} ({row.id}): field 'id': already used in {seen[row.id]}; give a new id")
            seen[row.id] = origin
            rows.append(row)
    return tuple(rows)
