"""GPU types a cluster file declares (gpus:): they work wherever a catalog type does, per cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.api import plan_report
from planner.sweeps import Change, apply_change
from traces import Cluster, SpecError, Workload, get_gpu
from traces.io import validate

WORKLOAD: dict[str, Any] = {
    "name": "small", "model": "qwen2.5-1.5b", "prompts_per_step": 8, "group_size": 4,
    "prompt_len": {"kind": "fixed", "value": 128}, "response_len": {"kind": "fixed", "value": 256}, "staleness": 1,
}


def _twin(catalog: str, name: str) -> dict[str, Any]:
    """A declaration of `name` with the figures of a catalog type (so the two must price the same)."""
    return {**get_gpu(catalog).model_dump(exclude={"aliases", "source", "price_source", "date"}), "name": name}


def _cluster(gpus: list[dict[str, Any]], groups: list[dict[str, Any]], name: str = "own") -> Cluster:
    return validate(Cluster, {"name": name, "gpus": gpus, "node_groups": groups}, name)


def _write_cluster(tmp_path: Path, gpus: list[dict[str, Any]], groups: list[dict[str, Any]]) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump({"name": "own", "gpus": gpus, "node_groups": groups}), encoding="utf-8")
    return path


def _refused(res, *needles: str) -> None:  # type: ignore[no-untyped-def]
    lines = res.err.strip().splitlines()
    assert (res.code, res.out, len(lines)) == (2, "", 1), res.err
    assert all(n in lines[0] for n in needles), lines[0]


def test_two_clusters_in_one_process_each_plan_with_their_own_x() -> None:
    workload = validate(Workload, WORKLOAD, "workload")
    fast = _cluster([_twin("H100", "X")], [{"gpu_type": "X", "nodes": 2}], "fast")
    slow = _cluster([_twin("L4", "X")], [{"gpu_type": "x", "nodes": 2}], "slow")  # names are case-insensitive
    assert fast.resolve("X").bf16_tflops == 989 and slow.resolve("X").bf16_tflops == 121
    assert slow.gpu_counts == {"X": 16}

    def planned(cluster: Cluster, gpu_type: str = "X") -> float:
        report = plan_report(cluster, workload, top_k=1, sim_steps=2, baselines=False, marginal=False)
        assert {g.gpu_type for g in report.plan.rollout} == {gpu_type}
        return report.chosen.samples_per_s

    first = planned(fast)
    on_l4 = planned(slow)
    assert planned(fast) == first  # planning slow's X in between changed nothing for fast's
    h100 = _cluster([], [{"gpu_type": "H100", "nodes": 2}])
    l4 = _cluster([], [{"gpu_type": "L4", "nodes": 2}])
    assert first == planned(h100, "H100") and on_l4 == planned(l4, "L4")
    assert first > on_l4


def test_catalog_clusters_do_not_see_a_declared_type() -> None:
    _cluster([_twin("H100", "Y")], [{"gpu_type": "Y", "nodes": 1}])
    with pytest.raises(SpecError, match="unknown GPU type 'Y'"):
        _cluster([], [{"gpu_type": "Y", "nodes": 1}])
    with pytest.raises(SpecError, match="unknown GPU type 'Y'"):
        get_gpu("Y")


def test_what_if_keeps_the_clusters_own_types() -> None:
    cluster = _cluster([_twin("L40S", "Box")], [{"gpu_type": "Box", "nodes": 1, "gpus_per_node": 4}])
    bigger, _ = apply_change(cluster, validate(Workload, WORKLOAD, "w"), Change("more", gpus={"box": 8}))
    assert bigger.gpu_counts == {"Box": 12} and bigger.resolve("Box") == cluster.resolve("Box")


def test_group_price_overrides_a_declared_price() -> None:
    cluster = _cluster([_twin("L4", "Z")], [{"gpu_type": "Z", "nodes": 1, "price_per_gpu_hour": 0.1},
                                            {"gpu_type": "Z", "nodes": 1}])
    assert [cluster.group_gpu(g).price_per_gpu_hour for g in cluster.node_groups] == [0.1, 0.45]


def test_cli_validate_costs_plan_simulate_with_a_declared_type(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = _write_cluster(tmp_path, [_twin("H800", "MyGPU")],
                          [{"gpu_type": "MyGPU", "nodes": 1}, {"gpu_type": "L40S", "nodes": 1}])
    workload = tmp_path / "w.yaml"
    workload.write_text(yaml.safe_dump(WORKLOAD), encoding="utf-8")
    res = cli("validate", "--cluster", str(path), "--json")
    assert res.code == 0, res.err
    assert res.json()["cluster"]["gpus"] == {"MyGPU": 8, "L40S": 8}

    args = ["--model", "qwen2.5-7b", "--batch", "32", "--context", "2048", "--json"]
    own = cli("costs", "decode", "--gpu", "mygpu", "--cluster", str(path), *args).json()
    assert own["gpu"] == "MyGPU" and own["seconds"] == cli("costs", "decode", "--gpu", "H800", *args).json()["seconds"]
    _refused(cli("costs", "decode", "--gpu", "MyGPU", *args), "unknown GPU type 'MyGPU'", "--cluster")
    sync = cli("costs", "sync", "--from", "MyGPU", "--to", "L40S", "--cluster", str(path), "--model", "qwen2.5-7b",
               "--json")
    assert sync.code == 0 and sync.json()["from"] == "MyGPU"

    plan = tmp_path / "plan.json"
    res = cli("plan", "--cluster", str(path), "--workload", str(workload), "--top-k", "1", "--sim-steps", "2",
              "--out", str(plan), "--json")  # with baselines: the homogeneous ones build clusters of their own
    assert res.code == 0, res.err
    assert "MyGPU" in res.json()["gpus"]
    sim = cli("simulate", "--cluster", str(path), "--workload", str(workload), "--plan", str(plan), "--steps", "2",
              "--json")
    assert sim.code == 0, sim.err
    assert sim.json()["samples_per_s"] > 0
    assert cli("validate", "--cluster", str(path), "--plan", str(plan)).code == 0


@pytest.mark.parametrize(("field", "value", "needle"), [
    ("bf16_tflops", 0, "greater than 0"), ("hbm_gb", -1, "greater than 0"), ("hbm_tb_per_s", float("nan"), "finite"),
    ("link_gb_per_s", float("inf"), "finite"), ("host_gb_per_s", "fast", "valid number"),
    ("price_per_gpu_hour", -0.5, "greater than or equal to 0"), ("bf16_tflops", True, "valid number"),
    ("hbm_gb", 1e9, "less than or equal"), ("matmul_ceiling", 1.5, "less than or equal to 1"),
    ("link_kind", "", "at least 1"), ("link_kind", "<nvlink>", "pattern"), ("name", "Ｘ", "pattern"),
    ("name", "", "at least 1"), ("aliases", ["ok", "bad\x00"], "pattern"),
])
def test_bad_gpu_fields_are_one_line_naming_the_field(cli, tmp_path: Path, field: str, value: Any,
                                                      needle: str) -> None:  # type: ignore[no-untyped-def]
    path = _write_cluster(tmp_path, [{**_twin("L4", "Mine"), field: value}], [{"gpu_type": "L4", "nodes": 1}])
    _refused(cli("validate", "--cluster", str(path)), f"gpus.0.{field}", needle)


@pytest.mark.parametrize(("gpus", "groups", "needles"), [
    ([_twin("L4", "h100")], [{"gpu_type": "L4", "nodes": 1}], ("'h100'", "catalog GPU type", "another name")),
    ([{**_twin("L4", "Mine"), "aliases": ["H100_SXM"]}], [{"gpu_type": "L4", "nodes": 1}],
     ("'H100_SXM'", "catalog GPU type")),
    ([_twin("L4", "Mine"), _twin("L40S", "mine")], [{"gpu_type": "L4", "nodes": 1}], ("'mine'", "declared twice")),
    ([_twin("L4", "Mine")], [{"gpu_type": "Theirs", "nodes": 1}], ("unknown GPU type 'Theirs'", "Mine", "gpus:")),
    ([{k: v for k, v in _twin("L4", "Mine").items() if k != "hbm_gb"}], [{"gpu_type": "Mine", "nodes": 1}],
     ("missing field 'gpus.0.hbm_gb'",)),
    ([{**_twin("L4", "Mine"), "tflops": 3}], [{"gpu_type": "Mine", "nodes": 1}], ("unknown field 'gpus.0.tflops'",)),
    ("L4", [{"gpu_type": "L4", "nodes": 1}], ("field 'gpus'", "valid tuple")),
])
def test_bad_declarations_are_one_line(cli, tmp_path: Path, gpus: Any, groups: list[dict[str, Any]],
                                       needles: tuple[str, ...]) -> None:  # type: ignore[no-untyped-def]
    _refused(cli("validate", "--cluster", str(_write_cluster(tmp_path, gpus, groups))), *needles)


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(sorted(_twin("L4", "Mine"))),
       value=st.sampled_from([0, -1, 1e30, 2.5, float("nan"), "eight", None, [], {"a": 1}, True, "ü" * 300, "ok"]))
def test_any_bad_gpu_field_is_one_line_or_accepted(cli, tmp_path: Path, field: str,
                                                    value: Any) -> None:  # type: ignore[no-untyped-def]
    path = _write_cluster(tmp_path, [{**_twin("L4", "Mine"), field: value}], [{"gpu_type": "L4", "nodes": 1}])
    res = cli("validate", "--cluster", str(path), "--json")
    if res.code == 0:
        assert res.json()["cluster"]["own_gpu_types"] == [value if field == "name" else "Mine"]
    else:
        _refused(res, f"gpus.0.{field}")


def test_costs_with_a_missing_cluster_file(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    _refused(cli("costs", "decode", "--gpu", "Mine", "--cluster", str(tmp_path / "none.yaml"), "--model",
                 "qwen2.5-7b", "--batch", "1", "--context", "8"), "none.yaml", "no such file")


def test_a_plan_naming_a_type_nobody_declares_is_refused(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path = _write_cluster(tmp_path, [_twin("L4", "Mine")], [{"gpu_type": "Mine", "nodes": 1}])
    plan = tmp_path / "p.json"
    plan.write_text('{"rollout": [{"gpu_type": "Nobody", "instances": 1}], "trainer": {"gpu_type": "Mine"}}')
    _refused(cli("validate", "--cluster", str(path), "--plan", str(plan)), "unknown GPU type 'Nobody'", "Mine")
