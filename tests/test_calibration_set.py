"""The shipped calibration set: size, breadth, citations, and the loader's handling of bad rows."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from traces import SpecError, get_gpu, model_names
from traces.calibration import UNITS, CalibrationRow, load_calibration
from traces.io import data_text

ROWS = load_calibration()
HEADER = data_text("calibration/sync.csv").splitlines()[0]


def _of(kind: str) -> list[CalibrationRow]:
    return [r for r in ROWS if r.kind == kind]


def test_set_has_30_rows_from_8_sources() -> None:
    assert len(ROWS) >= 30
    assert len({r.source_key for r in ROWS}) >= 8


def test_every_kind_has_rows_and_the_k_rows_are_kept() -> None:
    assert {r.kind for r in ROWS} == set(UNITS)
    assert {f"K{i}" for i in range(1, 10)} <= {r.id for r in ROWS}


def test_decode_batches_span_latency_to_throughput_regime() -> None:
    batches = sorted(r.batch for r in _of("decode") if r.batch is not None)
    assert batches[0] == 1 and batches[-1] >= 512
    assert sum(b <= 16 for b in batches) >= 3  # the latency regime is more than one point


def test_prefill_rows_include_batched_prompts() -> None:
    rows = _of("prefill")
    assert all(r.prompt_len for r in rows)
    assert any((r.batch or 1) > 1 for r in rows)


def test_training_spans_8_to_1000_plus_gpus_on_3_types() -> None:
    rows = _of("train")
    assert min(r.gpus for r in rows) <= 8 and max(r.gpus for r in rows) >= 1000
    assert len({r.gpu_type for r in rows}) >= 3
    assert all(r.layout for r in rows)


def test_rl_steps_cover_both_modes_and_a_per_phase_breakdown() -> None:
    rows = _of("rl_step")
    assert {r.mode for r in rows} == {"colocated", "disaggregated"}
    phases: dict[str, set[str]] = defaultdict(set)
    for r in rows:
        if r.run:
            phases[r.run].add(r.unit)
    assert any({"step_s", "gen_s", "train_s", "sync_s"} <= units for units in phases.values())


def test_a_disaggregated_run_has_a_per_phase_breakdown() -> None:
    runs: dict[str, set[str]] = defaultdict(set)
    for r in _of("rl_step"):
        if r.run and r.mode == "disaggregated":
            runs[r.run].add(r.unit)
    assert any({"step_s", "gen_s", "train_s"} <= units for units in runs.values())


def test_every_row_has_a_source_a_unit_and_a_place_in_it() -> None:
    for r in ROWS:
        assert r.source and r.where and r.unit in UNITS[r.kind], r.id


def test_catalog_names_are_spelled_as_the_catalog_spells_them() -> None:
    models = set(model_names())
    for r in ROWS:
        try:
            canonical = get_gpu(r.gpu_type).name
        except SpecError:
            canonical = r.gpu_type  # a public name outside the catalog
        assert r.gpu_type == canonical, f"{r.id}: write {canonical}, not {r.gpu_type}"
        assert r.model.lower() not in models or r.model in models, f"{r.id}: use the catalog's spelling"


def _write(tmp_path: Path, name: str, cells: str) -> Path:
    path = tmp_path / name
    path.write_text(HEADER + "\n" + cells + "\n", encoding="utf-8")
    return path


GOOD = ("C1,sync,qwen3-4b,bf16,H100,8,TP8,colocated,NCCL,,,,,,,0.3,sync_s,,somewhere,src,table 1,2026-12-01,")


def test_loader_reads_a_user_csv(tmp_path: Path) -> None:
    (row,) = load_calibration(_write(tmp_path, "sync.csv", GOOD))
    assert (row.id, row.value, row.batch, row.notes) == ("C1", 0.3, None, "")


@pytest.mark.parametrize(("name", "cells", "message"), [
    ("sync.csv", GOOD.replace("sync_s", "step_s"), r"sync\.csv:2 \(C1\): field '\(top level\)'.*not a sync unit"),
    ("decode.csv", GOOD, r"field 'kind': sync row in decode\.csv; move it to sync\.csv"),
    ("sync.csv", GOOD.replace(",somewhere,", ",,"), r"missing field 'source'; add it"),
    ("sync.csv", GOOD.replace(",8,", ",eight,"), r"field 'gpus'"),
    ("sync.csv", GOOD + ",extra", r"more cells than header columns"),
    ("sync.csv", GOOD + "\n" + GOOD, r"field 'id': already used"),
])
def test_bad_rows_are_one_line_spec_errors(tmp_path: Path, name: str, cells: str, message: str) -> None:
    with pytest.raises(SpecError, match=message) as err:
        load_calibration(_write(tmp_path, name, cells))
    assert "\n" not in str(err.value)
