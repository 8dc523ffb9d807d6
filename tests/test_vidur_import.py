"""Vidur's measured profiles as cost tables (`rlfleet profile import --format vidur`), and the cost model's use of them.

tests/data/vidur holds verbatim rows of Vidur's own tables (see its NOTICE.md): each imported row is
composed again here from those raw rows, independently of the importer's code.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from traces import CostModel, get_gpu, get_model
from traces.costmodel import roofline as rf
from traces.costmodel.efficiency import DEFAULT_EFFICIENCY
from traces.costmodel.tables import COLUMNS

RAW = Path(__file__).parent / "data" / "vidur"
GRID = ("--batches", "1,16", "--contexts", "128,1024", "--prefill-batches", "1,4", "--tp", "1,2")
A100, LLAMA3 = get_gpu("A100-80G"), get_model("llama-3.1-8b")


def _vidur_layer_ms(tp: int, tokens: int) -> float:
    """One layer on one GPU, ms: every operator Vidur's mlp.csv times except the embedding lookup."""
    raw = pd.read_csv(RAW / "compute/a100/meta-llama/Meta-Llama-3-8B/mlp.csv")
    rows = raw[(raw.num_tensor_parallel_workers == tp) & (raw.num_tokens == tokens)]
    ops = [c for c in raw.columns if c.startswith("time_stats.") and c.endswith(".median") and ".emb." not in c]
    assert len(ops) == 9 and len(rows) >= 1
    return float(rows[ops].sum(axis=1).mean())  # a boundary count measured twice: the mean


def _vidur_all_reduce_ms(tp: int, tokens: int) -> float:
    """One all-reduce of the layer's activations (tokens x hidden x 2 bytes) plus Vidur's 0.02 ms launch.

    Each size's time is the mean of the 9 sizes around it (the slice holds those around each needed one)."""
    if tp == 1:
        return 0.0
    raw = pd.read_csv(RAW / "network/a100_dgx/all_reduce.csv")
    raw = raw[(raw.num_workers == tp) & (raw.devices_per_node == tp)]
    sizes = np.sort(raw["size"].unique())
    nbytes = tokens * LLAMA3.hidden * 2
    hi = int(np.searchsorted(sizes, nbytes))
    below, above = sizes[hi - 1], sizes[hi]

    def smoothed(size: float) -> float:
        at = int(np.searchsorted(sizes, size))
        around = sizes[max(at - 4, 0):at + 5]
        return float(np.mean([raw[raw["size"] == s]["time_stats.all_reduce.median"].mean() for s in around]))

    return float(np.interp(nbytes, [below, above], [smoothed(below), smoothed(above)])) + 0.02


def _up_proj_ms(tp: int, tokens: int) -> float:
    raw = pd.read_csv(RAW / "compute/a100/meta-llama/Meta-Llama-3-8B/mlp.csv")
    rows = raw[(raw.num_tensor_parallel_workers == tp) & (raw.num_tokens == tokens)]
    return float(rows["time_stats.mlp_up_proj.median"].mean())


def _expected_seconds(row: pd.Series) -> tuple[float, float]:
    """(Vidur's own model time for the row: layers x (ops + 2 all-reduces), the whole row's seconds)."""
    tp, b, ctx = int(row.tp), int(row.batch), int(row.context)
    tokens = b if row.stage == "decode" else b * ctx
    vidur_ms = LLAMA3.layers * (_vidur_layer_ms(tp, tokens) + 2 * _vidur_all_reduce_ms(tp, tokens))
    lm_head_ms = _up_proj_ms(tp, b) * LLAMA3.vocab / (2 * LLAMA3.intermediate)
    eff = DEFAULT_EFFICIENCY
    if row.stage == "decode":
        rest = (rf.decode_seconds(A100, LLAMA3, tp, b, ctx, eff) - rf.decode_seconds(A100, LLAMA3, tp, b, 0, eff)
                + eff.decode_overhead_s + eff.decode_overhead_per_seq_s * b)
    else:
        rest = (rf.prefill_seconds(A100, LLAMA3, tp, tokens, ctx, eff)
                - rf.prefill_seconds(A100, LLAMA3, tp, tokens, 0, eff) + eff.prefill_overhead_s)
    return vidur_ms / 1e3, (vidur_ms + lm_head_ms) / 1e3 + float(rest)


def test_imported_rows_reproduce_vidurs_operator_sums(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "vidur.csv"
    res = cli("profile", "import", "--format", "vidur", str(RAW), "--gpu", "a100", "--model", "llama-3.1-8b",
              *GRID, "--commit", "7d47513363ec447a741ac5e47241580b47724fbf", "--out", str(out), "--json")
    assert res.code == 0, res.err
    frame = pd.read_csv(out)
    assert tuple(frame.columns) == COLUMNS
    # decode: 2 batches x 2 contexts; prefill: 1x128, 1x1024, 4x128, 4x1024 (all within 16k); per TP degree
    assert len(frame) == 2 * (4 + 4) and set(frame.tp) == {1, 2}
    assert frame.source.str.contains("microsoft/vidur @ 7d47513363ec447a741ac5e47241580b47724fbf").all()
    assert frame.source.str.contains("Meta-Llama-3-8B/mlp.csv").all() and frame.source.str.contains("roofline").all()
    assert frame[frame.tp == 2].source.str.contains("a100_dgx/all_reduce.csv").all()

    from traces.costmodel.vidur import import_rows, pairs, profiling_root

    root = profiling_root(RAW)
    parts = import_rows(root, pairs(root)[0], [1, 2], _grid())
    for (_, row), (_, part) in zip(frame.iterrows(), parts.iterrows(), strict=True):
        vidur_s, total_s = _expected_seconds(row)
        # the measured part is Vidur's own sum, to rounding: a dropped or doubled operator shows
        assert part.layers_s + part.all_reduce_s == pytest.approx(vidur_s, rel=1e-6)
        assert row.seconds == pytest.approx(total_s, rel=0.02)


def _grid():  # type: ignore[no-untyped-def]
    from traces.costmodel.vidur import Grid

    return Grid(batches=(1, 16), contexts=(128, 1024), prefill_batches=(1, 4))


def test_shipped_table_is_the_import_of_vidurs_rows() -> None:
    """The shipped A100 llama-3.1-8b table agrees with rows composed from the raw slice here."""
    shipped = _shipped("vidur-a100-llama-3.1-8b.csv")
    for stage, tp, b, ctx in [("decode", 1, 1, 128), ("decode", 2, 16, 1024), ("prefill", 1, 4, 1024)]:
        row = shipped[(shipped.stage == stage) & (shipped.tp == tp) & (shipped.batch == b) & (shipped.context == ctx)]
        assert len(row) == 1
        assert float(row.seconds.iloc[0]) == pytest.approx(_expected_seconds(row.iloc[0])[1], rel=0.02)


def test_cost_model_prefers_the_imported_table() -> None:
    cm, roof = CostModel(), CostModel.roofline_only()
    table = _shipped("vidur-a100-llama-3.1-8b.csv")
    point = table[(table.stage == "decode") & (table.tp == 1) & (table.batch == 16) & (table.context == 1024)]
    inside = cm.decode(A100, LLAMA3, 1, 16, 1024)
    assert inside.sources == {"profile"}
    assert float(inside) == pytest.approx(float(point.seconds.iloc[0]), rel=1e-5)
    assert float(inside) != pytest.approx(float(roof.decode(A100, LLAMA3, 1, 16, 1024)), rel=1e-3)
    # prefill is keyed by tokens: the table's rows at 4096 tokens (1x4096, 4x1024, 16x256), averaged
    at_4k = table[(table.stage == "prefill") & (table.tp == 1) & (table.tokens == 4096)].seconds
    assert len(at_4k) == 3
    assert float(cm.prefill(A100, LLAMA3, 1, 4096).seconds) == pytest.approx(at_4k.mean(), rel=1e-5)
    # past the table's contexts the roofline is scaled to its nearest row; a TP it lacks, or a model or
    # GPU type Vidur did not measure, is the roofline's
    assert cm.decode(A100, LLAMA3, 1, 16, 65536).sources == {"profile-scaled"}
    assert cm.decode(A100, LLAMA3, 3, 16, 1024).sources == {"roofline"}
    for gpu, model in [(A100, get_model("qwen2.5-7b")), (get_gpu("H100"), LLAMA3)]:
        est = cm.decode(gpu, model, 1, 16, 1024)
        assert est.sources == {"roofline"} and float(est) == float(roof.decode(gpu, model, 1, 16, 1024))


@pytest.mark.parametrize(("args", "needle"), [
    (("--format", "vidur", "no/such/folder"), "no such folder"),
    (("--format", "sarathi", str(RAW)), "--format vidur"),
    ((str(RAW),), "--format is missing"),
    (("--format", "vidur", str(RAW), "--gpu", "L4"), "Vidur has no profiles"),
    (("--format", "vidur", str(RAW), "--gpu", "h100", "--model", "llama-3.1-8b"), "no compute/h100"),
    (("--format", "vidur", str(RAW), "--model", "qwen2.5-7b"), "no Vidur profile maps"),
    (("--format", "vidur", str(RAW), "--model", "llama-3.1-8b", "--tp", "3"), "no mlp rows"),
    (("--format", "vidur", str(RAW), "--tp", "1,x"), "comma-separated"),
])
def test_import_bad_input_is_one_line(cli, args: tuple[str, ...], needle: str) -> None:  # type: ignore[no-untyped-def]
    res = cli("profile", "import", *args)
    assert res.code == 2 and needle in res.err and len(res.err.strip().splitlines()) == 1, res.err


def test_tp_without_an_all_reduce_table_is_refused(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    import shutil

    shutil.copytree(RAW / "compute", tmp_path / "compute")  # the operator rows, no network/ folder
    res = cli("profile", "import", "--format", "vidur", str(tmp_path), "--tp", "2", "--out", str(tmp_path / "o.csv"))
    assert res.code == 2 and "no all-reduce table network/a100_dgx/all_reduce.csv" in res.err and "--tp 1" in res.err
    assert len(res.err.strip().splitlines()) == 1
    res = cli("profile", "import", "--format", "vidur", str(tmp_path), *GRID[:6], "--out", str(tmp_path / "o.csv"))
    assert res.code == 0 and set(pd.read_csv(tmp_path / "o.csv").tp) == {1}  # by default: the TP it can price


def test_measuring_still_needs_model_and_gpu_type(cli) -> None:  # type: ignore[no-untyped-def]
    res = cli("profile", "--gpu-type", "CPU")
    assert res.code == 2 and "--model and --gpu-type" in res.err and len(res.err.strip().splitlines()) == 1


def _shipped(name: str) -> pd.DataFrame:
    return pd.read_csv(resources.files("traces").joinpath("data", "profiles", name))  # type: ignore[arg-type]
