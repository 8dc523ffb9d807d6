"""Sweeps on an executor (planner.executors): what_if, pareto and plan_many give the same answers,
bit for bit, in this process, in local processes and as Ray tasks on a local Ray on loopback."""

from __future__ import annotations

from collections.abc import Iterator

import pandas as pd
import pandas.testing as pdt
import pytest

from planner.batch import PlanRequest, plan_many
from planner.executors import Executor, Job, join_ray, run
from planner.sweeps import Change, pareto, what_if
from traces import Cluster, CostModel, SpecError, Workload, get_model
from traces.lengths import LengthDist
from traces.ray_address import check_ray_address, host_port

CM = CostModel.roofline_only()
# a small async job on two nodes: a sweep of four variants simulates in seconds
FLEET = Cluster(name="tiny", node_groups=({"gpu_type": "H800", "nodes": 1}, {"gpu_type": "H20", "nodes": 1}))
JOB = Workload(model=get_model("qwen2.5-1.5b"), prompts_per_step=8, group_size=4,
               prompt_len=LengthDist(kind="uniform", low=64, high=256),
               response_len=LengthDist(kind="lognormal", mean=600, sigma=0.8, cap=2048),
               mode="async", staleness=2, interruptible=False)
# one variant cannot be planned (a lone node cannot run async): its row carries the reason on every executor
CHANGES = [Change("+8 H20", gpus={"H20": 8}), Change("eta 0", workload={"staleness": 0}),
           Change("budget $20/h", budget=20.0), Change("no H800", gpus={"H800": -8})]


def _what_if(executor: Executor | str) -> pd.DataFrame:
    return what_if(FLEET, JOB, CHANGES, cost_model=CM, sim_steps=2, top_k=1, executor=executor)


def _pareto(executor: Executor | str) -> pd.DataFrame:
    return pareto(FLEET, JOB, points=3, cost_model=CM, sim_steps=2, executor=executor)


def _same(left: pd.DataFrame, right: pd.DataFrame) -> None:
    """Every column, numeric ones compared exactly (no tolerance), in the same row order."""
    pdt.assert_frame_equal(left, right, check_exact=True)
    numeric = left.select_dtypes("number").columns
    assert len(numeric) >= 5 and (left[numeric].to_numpy() == right[numeric].to_numpy()).all()


@pytest.fixture(scope="module")
def serial() -> dict[str, pd.DataFrame]:
    frames = {"what_if": _what_if("serial"), "pareto": _pareto("serial")}
    assert list(frames["what_if"].variant) == ["baseline", *(c.name for c in CHANGES)]
    assert frames["what_if"].loc[4, "note"] and frames["what_if"].loc[1, "samples_per_s"] > 0
    assert len(frames["pareto"]) == 3
    return frames


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    """The executor's own start: a new local Ray (never one another user started), on loopback."""
    ray = pytest.importorskip("ray", reason="ray is part of the runtime extra that make test installs")
    if ray.is_initialized():  # another module's Ray: this module starts its own
        ray.shutdown()
    join_ray(None)
    assert all(n["NodeManagerAddress"] == "127.0.0.1" for n in ray.nodes())  # loopback only
    yield
    ray.shutdown()


def test_processes_equal_serial(serial: dict[str, pd.DataFrame]) -> None:
    _same(_what_if(Executor("processes", workers=2)), serial["what_if"])
    _same(_pareto("processes"), serial["pareto"])


def test_ray_equals_serial(serial: dict[str, pd.DataFrame], local_ray: None) -> None:
    _same(_what_if("ray"), serial["what_if"])
    _same(_pareto("ray"), serial["pareto"])


def test_plan_many_answers_in_request_order_on_every_executor(local_ray: None) -> None:
    requests = [PlanRequest(FLEET, JOB, {"sim_steps": 2, "top_k": 1, "baselines": False, "marginal": False}),
                PlanRequest(FLEET, JOB, {"sim_steps": 2, "top_k": 1, "budget": 1.0, "marginal": False}),
                PlanRequest(FLEET, JOB.model_copy(update={"staleness": 0}),
                            {"sim_steps": 2, "top_k": 1, "baselines": False, "marginal": False})]
    answers = {kind: plan_many(requests, cost_model=CM, executor=kind) for kind in ("serial", "processes", "ray")}
    first = answers["serial"]
    assert first[0].plan is not None and first[2].plan is not None and first[0].plan != first[2].plan
    assert first[1].plan is None and "budget" in first[1].error  # $1/h buys no plan: its reason, not a crash
    for kind in ("processes", "ray"):  # all but the wall-clock timings
        assert [(a.plan, _untimed(a.summary), a.error) for a in answers[kind]] == \
            [(a.plan, _untimed(a.summary), a.error) for a in first], kind


def _untimed(summary: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in summary.items() if k != "seconds"}


def _fails_on_odd(context: int, item: int) -> int:
    if item % 2:
        raise SpecError(f"item {item} is odd")
    return context + item


def test_an_items_spec_error_is_the_same_one_line_on_every_executor() -> None:
    job = Job(int, _fails_on_odd, 10)
    assert run(job, [0, 2, 4], "serial") == run(job, [0, 2, 4], "processes") == [10, 12, 14]
    for kind in ("serial", "processes"):
        with pytest.raises(SpecError, match=r"^item 3 is odd$"):  # the first failing item in input order
            run(job, [2, 3, 4, 5], kind)


def test_bad_executor_values_are_one_line() -> None:
    with pytest.raises(SpecError, match="choose one of auto, serial, processes, ray"):
        Executor("threads")
    with pytest.raises(SpecError, match="drop it, or use executor 'ray'"):
        Executor("serial", ray_address="127.0.0.1:6379")
    with pytest.raises(SpecError, match="at least 1"):
        Executor("processes", workers=0)
    for bad in ("127.0.0.1", "http://head:6379", "head:99999", "", "a b:1"):
        with pytest.raises(SpecError, match="give the head's host:port"):
            check_ray_address(bad)
    for good in ("auto", "local", "127.0.0.1:6379", "ray://head-0.svc:10001", "[::1]:6379"):
        assert check_ray_address(good) == good
    assert host_port("ray://head-0.svc:10001") == ("head-0.svc", 10001) and host_port("[::1]:6379") == ("::1", 6379)
    assert host_port("auto") is None
    assert Executor(ray_address="10.0.0.1:6379").resolve(8) == "ray"
    assert Executor().resolve(1) == "serial"


def test_cli_executor_flags(cli, write) -> None:  # type: ignore[no-untyped-def]
    c = write("c.yaml", "name: tiny\nnode_groups:\n  - {gpu_type: H800, nodes: 1}\n  - {gpu_type: H20, nodes: 1}\n")
    w = write("w.yaml", "model: qwen2.5-1.5b\nprompts_per_step: 8\ngroup_size: 4\nmode: async\nstaleness: 1\n"
                         "prompt_len: {kind: fixed, value: 128}\nresponse_len: {kind: uniform, low: 64, high: 512}\n")
    base = ("plan", "--cluster", str(c), "--workload", str(w))
    for argv, says in (((*base, "--objective", "pareto", "--executor", "threads"), "invalid choice"),
                       ((*base, "--objective", "pareto", "--ray-address", "nowhere"), "give the head's host:port"),
                       ((*base, "--executor", "serial"), "place the points of --objective pareto"),
                       ((*base, "--objective", "pareto", "--sim-steps", "2", "--ray-address", "127.0.0.1:1"),
                        "nothing answers at Ray address 127.0.0.1:1"),  # port 1: refused at once
                       ((*base, "--objective", "pareto", "--executor", "processes", "--ray-address", "auto"),
                        "use executor 'ray'")):
        r = cli(*argv)
        assert r.code == 2 and says in r.err and len(r.err.strip().splitlines()) == 1, (argv, r.err)
    serial = cli(*base, "--objective", "pareto", "--sim-steps", "2", "--executor", "serial", "--json")
    processes = cli(*base, "--objective", "pareto", "--sim-steps", "2", "--executor", "processes", "--json")
    assert serial.code == processes.code == 0 and serial.json() == processes.json() and serial.json()["pareto"]
