"""A prompt/answer data set read from JSONL (one JSON object a line) or parquet.

The field names are the caller's (`--prompt-field`, `--answer-field`): a prompt must be text; an
answer may be text or a number (a number is kept as its text: 5 -> "5"). Every problem is named in
one line: the file, the line (JSONL) or row (parquet), the field and what to do about it.
"""

from __future__ import annotations

import json
import numbers
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from traces.errors import SpecError
from traces.io import read_user_text

MAX_DATASET_BYTES = 512 * 1024**2  # read whole into memory: past this, shard the file


@dataclass(frozen=True)
class Record:
    prompt: str
    answer: str


def load_records(path: str | os.PathLike[str], prompt_field: str = "prompt",
                 answer_field: str = "answer") -> tuple[Record, ...]:
    """Every record of the file, in order; SpecError on the first one that cannot be used."""
    p = Path(path)
    rows = _parquet_rows(p) if p.suffix == ".parquet" else _jsonl_rows(p)
    records = tuple(_record(where, row, prompt_field, answer_field) for where, row in rows)
    if not records:
        raise SpecError(f"{p}: the data set is empty; it needs records with {prompt_field!r} and "
                        f"{answer_field!r} (JSONL: one JSON object a line)")
    return records


def _jsonl_rows(path: Path) -> list[tuple[str, Any]]:
    text = read_user_text(path, MAX_DATASET_BYTES)
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append((f"{path}:{n}", json.loads(line)))
        except json.JSONDecodeError as exc:
            raise SpecError(f"{path}:{n}: not JSON ({exc.msg}); a JSONL data set has one object a line") from None
    return rows


def _parquet_rows(path: Path) -> list[tuple[str, Any]]:
    try:
        import pandas as pd

        frame = pd.read_parquet(path)
    except ImportError as exc:
        raise SpecError(f"{path}: reading parquet needs pyarrow ({exc}); pip install pyarrow, "
                        "or convert the file to JSONL") from None
    except (OSError, ValueError) as exc:
        raise SpecError(f"{path}: not a readable parquet file ({exc})") from None
    return [(f"{path}: row {i}", row) for i, row in enumerate(frame.to_dict(orient="records"))]


def _record(where: str, row: Any, prompt_field: str, answer_field: str) -> Record:
    if not isinstance(row, dict):
        raise SpecError(f"{where}: expected a JSON object with {prompt_field!r} and {answer_field!r}, "
                        f"got {type(row).__name__}")
    for name in (prompt_field, answer_field):
        if name not in row:
            fields = ", ".join(map(repr, sorted(row))) or "none"
            raise SpecError(f"{where}: no field {name!r} (fields: {fields}); name the right one with "
                            f"--{'prompt' if name == prompt_field else 'answer'}-field")
    prompt, answer = row[prompt_field], row[answer_field]
    if not isinstance(prompt, str) or not prompt.strip():
        raise SpecError(f"{where}: field {prompt_field!r} must be non-empty text, got {prompt!r}")
    if isinstance(answer, numbers.Number) and not isinstance(answer, bool):
        answer = str(answer)
    if not isinstance(answer, str) or not answer.strip():
        raise SpecError(f"{where}: field {answer_field!r} must be text or a number, got {answer!r}")
    return Record(prompt, answer)
