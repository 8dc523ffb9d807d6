"""The phases of an RL trainer step, and the per-step timing logs that frameworks write of them.

One name per phase, shared by the simulator's breakdown (sim.breakdown), `rlfleet calibrate` and
`rlfleet simulate --breakdown`: `wait` (the trainer waiting for its batch: generation in sync and
colocated modes), `switch` (colocated hand-overs), `logprob` (old policy, plus the reference's),
`train` (the PPO minibatches), `sync` (the weight push) and `step` (all of it).

verl writes `timing_s/<phase>` per step in its metrics (JSONL through its file logger, or a CSV
export of the same rows): `gen`, `old_log_prob`, `ref`, `update_actor`, the weight update, `step`.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from pathlib import Path

from traces.errors import SpecError
from traces.io import read_user_text
from traces.records import MAX_RECORD_BYTES

PHASES = ("wait", "switch", "logprob", "train", "sync", "step")
# verl's names for each phase (summed where a phase has several: logprob = old policy + reference).
VERL_KEYS: dict[str, tuple[str, ...]] = {
    "wait": ("timing_s/gen",),
    "logprob": ("timing_s/old_log_prob", "timing_s/ref"),
    "train": ("timing_s/update_actor",),
    "sync": ("timing_s/update_weights", "timing_s/sync_weights"),
    "step": ("timing_s/step",),
}


def _rows(path: Path, text: str) -> list[dict[str, object]]:
    if path.suffix.lower() == ".csv":
        return list(csv.DictReader(io.StringIO(text)))
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise SpecError(f"{path}:{n}: not JSON lines ({exc.msg}); give a .jsonl or .csv metrics file") from None
        if isinstance(row, dict):
            rows.append(row.get("data", row) if isinstance(row.get("data"), dict) else row)
    return rows


def _number(path: Path, step: int, key: str, value: object) -> float:
    try:
        x = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise SpecError(f"{path}: step {step}: {key} is not a number ({value!r})") from None
    if not math.isfinite(x) or x < 0:
        raise SpecError(f"{path}: step {step}: {key} must be a finite number of seconds >= 0, got {value!r}")
    return x


def read_phase_log(path: str | os.PathLike[str]) -> list[dict[str, float]]:
    """Per-step phase seconds from a verl-style metrics file (JSONL or CSV with `timing_s/...` columns)."""
    p = Path(path)
    rows = _rows(p, read_user_text(p, MAX_RECORD_BYTES))  # a run's metrics: the cap of run records
    out = []
    for i, row in enumerate(rows):
        step: dict[str, float] = {}
        for phase, keys in VERL_KEYS.items():
            present = [k for k in keys if row.get(k) not in (None, "")]
            if present:
                step[phase] = sum(_number(p, i, k, row[k]) for k in present)
        if "step" in step:
            out.append(step)
    if not out:
        raise SpecError(f"{p}: no step with a timing_s/step value; give verl's per-step metrics "
                        f"({', '.join(k for keys in VERL_KEYS.values() for k in keys)})")
    return out
