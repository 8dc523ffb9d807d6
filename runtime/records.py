"""What a run writes: `metrics.jsonl` (one line per step) and `timeline.csv` in the simulator's format.

The formats are traces.records' (shared with the simulator): the timeline has the simulator's
columns, times in seconds from the run's start, so a measured run and its simulation compare with
one function call (sim.fidelity). Files are rewritten atomically at each flush: a reader
(or a crash) sees the previous complete file or the new one, never half of one.

Checkpoints are committed in two phases: the trainer writes its state to `checkpoints/trainer-<v>.pt`
(possibly from another node: the run folder must be shared, as on any cluster), the driver flushes
the records, then writes `checkpoint.json` (the commit record: version, trainer file, the
controller's state, how many records belong to it, the run's identity). A crash between the two
leaves the previous commit whole, and it names a trainer file that is still there: older ones are
deleted only after a new commit.
"""

from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from traces.errors import SpecError
from traces.io import atomic_write_text
from traces.records import (
    METRICS_FILE,
    TIMELINE_COLUMNS,
    TIMELINE_FILE,
    TOOL_ACTIVITY,
    TOOL_CALL_COLUMNS,
    TOOL_CALLS_FILE,
    TOOL_GROUP,
    TOOL_RESOURCE,
    read_metrics,
)

if TYPE_CHECKING:
    from runtime.episodes import ToolCall

__all__ = ["TIMELINE_COLUMNS", "RunRecorder", "read_metrics"]

CHECKPOINT_FILE = "checkpoint.json"  # the commit record; see the module docstring
TRAINER_DIR = "checkpoints"
CHECKPOINT_FORMAT = 1


@dataclass
class RunRecorder:
    out_dir: Path | None
    origin: float  # clock reading at the run's start
    timeline: list[tuple[str, str, str, float, float, int, int]] = field(default_factory=list)
    metrics: list[dict[str, Any]] = field(default_factory=list)
    # (sample, turn, start, end, latency, version) of each tool call, times from the origin (agentic runs)
    tool_calls: list[tuple[int, int, float, float, float, int]] = field(default_factory=list)

    def tool_call(self, call: ToolCall) -> None:
        """One tool call: a row of its own, and its span in the timeline (the sample was on no engine)."""
        self.tool_calls.append((call.sample, call.turn, call.start - self.origin, call.end - self.origin,
                                call.latency, call.version))
        self.interval(TOOL_RESOURCE, TOOL_GROUP, TOOL_ACTIVITY, call.start, call.end, call.version, 1)

    def interval(self, resource: str, group: str, activity: str, start: float, end: float, version: int,
                 samples: int) -> None:
        if end > start:
            self.timeline.append((resource, group, activity, start - self.origin, end - self.origin, version,
                                  samples))

    def metric(self, row: dict[str, Any]) -> None:
        self.metrics.append(row)

    def copy(self) -> RunRecorder:
        """The rows so far (rows are never changed once recorded, so the lists are copied, not the rows)."""
        return RunRecorder(self.out_dir, self.origin, list(self.timeline), list(self.metrics), list(self.tool_calls))

    def position(self) -> dict[str, Any]:
        """What a checkpoint needs to continue these records: the origin and how many rows are committed."""
        return {"origin": self.origin, "metrics": len(self.metrics), "timeline": len(self.timeline),
                "tool_calls": len(self.tool_calls)}

    @classmethod
    def resume(cls, out_dir: Path, position: dict[str, Any]) -> RunRecorder:
        """The records as of a checkpoint: rows written after it (by a run that then died) are dropped,
        since the resumed run redoes that work and records it again."""
        metrics = read_metrics(out_dir)[: int(position["metrics"])]
        with (out_dir / TIMELINE_FILE).open(encoding="utf-8", newline="") as handle:
            rows = list(csv.reader(handle))[1: 1 + int(position["timeline"])]
        timeline = [(r[0], r[1], r[2], float(r[3]), float(r[4]), int(r[5]), int(r[6])) for r in rows]
        if len(metrics) != int(position["metrics"]) or len(timeline) != int(position["timeline"]):
            raise SpecError(f"{out_dir}: {METRICS_FILE} or {TIMELINE_FILE} is shorter than its checkpoint says; "
                            "the run folder was changed after the checkpoint")
        calls: list[tuple[int, int, float, float, float, int]] = []
        if position.get("tool_calls") and (out_dir / TOOL_CALLS_FILE).is_file():
            with (out_dir / TOOL_CALLS_FILE).open(encoding="utf-8", newline="") as handle:
                calls = [(int(r[0]), int(r[1]), float(r[2]), float(r[3]), float(r[4]), int(r[5]))
                         for r in list(csv.reader(handle))[1: 1 + int(position["tool_calls"])]]
        return cls(out_dir, float(position["origin"]), timeline, metrics, calls)

    def flush(self) -> None:
        if self.out_dir is None:
            return
        atomic_write_text(self.out_dir / METRICS_FILE, "".join(json.dumps(m) + "\n" for m in self.metrics))
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(TIMELINE_COLUMNS)
        for res, group, act, start, end, version, samples in self.timeline:
            writer.writerow([res, group, act, f"{start:.6f}", f"{end:.6f}", version, samples])
        atomic_write_text(self.out_dir / TIMELINE_FILE, buf.getvalue())
        if self.tool_calls:
            calls = io.StringIO()
            writer = csv.writer(calls, lineterminator="\n")
            writer.writerow(TOOL_CALL_COLUMNS)
            for sample, turn, start, end, latency, version in self.tool_calls:
                writer.writerow([sample, turn, f"{start:.6f}", f"{end:.6f}", f"{latency:.6f}", version])
            atomic_write_text(self.out_dir / TOOL_CALLS_FILE, calls.getvalue())


def trainer_checkpoint_path(out_dir: Path, version: int) -> Path:
    return out_dir / TRAINER_DIR / f"trainer-{version:06d}.pt"


def commit_checkpoint(out_dir: Path, record: dict[str, Any]) -> None:
    """Write the commit record (atomically), then drop trainer files no commit names any more."""
    record = {"format": CHECKPOINT_FORMAT, **record}
    atomic_write_text(out_dir / CHECKPOINT_FILE, json.dumps(record, separators=(",", ":")) + "\n")
    # only older files: a newer one may be a checkpoint being written while this one commits
    for old in (out_dir / TRAINER_DIR).glob("trainer-*.pt"):
        if old.stem.removeprefix("trainer-").isdigit() and int(old.stem.removeprefix("trainer-")) < record["version"]:
            old.unlink(missing_ok=True)


def read_checkpoint(out_dir: str | os.PathLike[str], identity: dict[str, Any]) -> dict[str, Any]:
    """The last committed checkpoint in `out_dir`, checked to belong to a run of this `identity`.

    SpecError (one line, exit 2 in the CLI) for a folder with no checkpoint, a damaged record, or a
    checkpoint of another plan, task, model or seed: resuming it would silently train something else.
    """
    folder = Path(out_dir)
    identity = json.loads(json.dumps(identity, sort_keys=True))  # compare as stored (tuples are lists there)
    path = folder / CHECKPOINT_FILE
    if not path.is_file():
        raise SpecError(f"{folder}: no checkpoint to resume from ({CHECKPOINT_FILE} is missing); "
                        "start the run without --resume, or point --resume at a run folder")
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        fmt, theirs, trainer = record["format"], record["identity"], record["trainer"]
    except (ValueError, KeyError, TypeError) as exc:
        raise SpecError(f"{path}: not a readable checkpoint record ({type(exc).__name__}: {exc})") from None
    if fmt != CHECKPOINT_FORMAT:
        raise SpecError(f"{path}: checkpoint format {fmt}, this rlfleet reads {CHECKPOINT_FORMAT}")
    for key in sorted(set(identity) | set(theirs)):
        if identity.get(key) != theirs.get(key):
            raise SpecError(f"{folder}: the checkpoint is of a different run ({key} {theirs.get(key)!r} there, "
                            f"{identity.get(key)!r} here); resume with the same plan, task and seed")
    if not (folder / trainer).is_file():
        raise SpecError(f"{folder}: the checkpoint names {trainer}, which is missing")
    return record


def resume_record(out: Path | None, resume: bool, identity: dict[str, Any], steps: int) -> dict[str, Any] | None:
    """The checkpoint to continue (SpecError: none, another run's, or already at `steps`), or None."""
    if not resume:
        return None
    if out is None:
        raise SpecError("resuming needs the run folder (out_dir)")
    record = read_checkpoint(out, identity)
    if int(record["version"]) >= steps:
        raise SpecError(f"{out}: the checkpoint is at step {record['version']} already; ask for more than "
                        f"{record['version']} steps to continue it")
    return record
