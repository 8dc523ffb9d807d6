"""The plan is the run: `rlfleet run` places every plan group on its GPU type and plan-assigned nodes.

One Ray cluster of fake nodes on loopback for the module (runtime.local_cluster, mirroring
tests/data/place/two-type-cluster.yaml: nodes 0 and 1 of type cpu-a with 2 "GPUs" each, node 2 of
type cpu-b with 1), joined by the CLI with `--address`:
- a two-type async plan (rollout on cpu-a in two groups of 2 and 1 engines, on nodes 1 and 0;
  trainer on cpu-b, node 2): every actor sits on a node of its group's type and on its plan node
  (from the actors' own node ids and Ray's node labels), 40 steps, the reward rises, the staleness
  bound holds, every admitted sample is trained once; `rlfleet fidelity` reports per group;
- a sync plan and a colocated plan (engine and trainer on one bundle) run and are recorded as such.
Without Ray: the bundles' nodes from a plan (traces.placement), and the refusals said before Ray
starts (trainer pp 2, a machine too small for the fake cluster).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from traces import SpecError, load_cluster, load_plan
from traces.placement import NODE_LABEL, NODE_RESOURCE, TYPE_LABEL, group_shapes

DATA = Path("tests/data/place")
CLUSTER, PLAN, WORKLOAD = DATA / "two-type-cluster.yaml", DATA / "two-type-async.json", DATA / "addition-async.yaml"
STEPS = 40


# -- without Ray ------------------------------------------------------------------------------------
def test_bundles_fill_the_plans_nodes_in_order() -> None:
    cluster, plan = load_cluster(CLUSTER), load_plan(PLAN)
    shapes = group_shapes(plan, cluster)
    assert [(s.role, s.actors, s.nodes) for s in shapes] == [("rollout", 2, (1, 1)), ("rollout", 1, (0,)),
                                                             ("train", 1, (2,))]
    assert shapes[0].bundles(gpus=False)[0][NODE_RESOURCE.format(1)] > 0
    assert NODE_RESOURCE.format(1) not in shapes[0].bundles(gpus=False, pin_nodes=False)[0]
    # two groups sharing node 0 (2 GPUs): the second group's engine goes on after the first's
    shared = plan.model_copy(update={"rollout": (plan.rollout[0].model_copy(update={"instances": 1, "nodes": (0, 1)}),
                                                 plan.rollout[1].model_copy(update={"nodes": (0, 1)}))})
    assert [s.nodes for s in group_shapes(shared, cluster)[:2]] == [(0,), (0,)]
    # colocated: engines on the trainer's bundles, from the first on
    colo = _colocated(plan)
    engine, trainer = group_shapes(colo, cluster)
    assert (engine.shared, engine.offset, engine.bundles(gpus=False), trainer.nodes) == (True, 0, [], (1,))
    three = shared.model_copy(update={"rollout": (plan.rollout[0].model_copy(update={"instances": 3, "nodes": (0,)}),)})
    with pytest.raises(SpecError, match="rollout group 0: its 3 x 1 GPUs do not fit on its nodes 0"):
        group_shapes(three, cluster)


def test_unrunnable_plans_are_refused_in_one_line_before_ray_starts(cli: Callable[..., Any],
                                                                    write: Callable[[str, str], Path]) -> None:
    import ray

    plan = json.loads(PLAN.read_text())
    pp2 = write("pp2.json", json.dumps({**plan, "rollout": [{"gpu_type": "cpu-a", "instances": 1, "nodes": [0]}],
                                        "trainer": {"gpu_type": "cpu-a", "dp": 1, "pp": 2, "nodes": [1]}}))
    res = cli("run", str(pp2), "--cluster", str(CLUSTER), "--workload", str(WORKLOAD), "--local", "--steps", "1")
    assert res.code == 2 and "trainer pp=2" in res.err and len(res.err.strip().splitlines()) == 1, res.err
    assert not ray.is_initialized()  # refused before Ray (or any fake node) started
    tp2 = write("tp2.json", json.dumps({**plan, "rollout": [{"gpu_type": "cpu-a", "tp": 2, "instances": 1}]}))
    res = cli("run", str(tp2), "--cluster", str(CLUSTER), "--workload", str(WORKLOAD), "--steps", "1")
    assert res.code == 2 and "tp 2" in res.err and "torch engine" in res.err and len(res.err.strip().splitlines()) == 1
    other = write("w.yaml", WORKLOAD.read_text().replace("staleness: 2", "staleness: 1"))
    res = cli("run", str(PLAN), "--cluster", str(CLUSTER), "--workload", str(other), "--steps", "1")
    assert res.code == 2 and "staleness 1" in res.err and len(res.err.strip().splitlines()) == 1
    caps = write("caps.json", json.dumps({**plan, "rollout": [{**plan["rollout"][0], "max_num_seqs": 8},
                                                              plan["rollout"][1]]}))
    res = cli("run", str(caps), "--cluster", str(CLUSTER), "--workload", str(WORKLOAD), "--in-process", "--steps", "1")
    assert res.code == 2 and "8, 256" in res.err and len(res.err.strip().splitlines()) == 1, res.err
    assert not ray.is_initialized()


def test_a_cluster_too_big_for_this_machine_is_refused_with_what_it_needs(cli: Callable[..., Any],
                                                                          write: Callable[[str, str], Path]) -> None:
    from runtime.local_cluster import check_fits

    cluster, plan = load_cluster(CLUSTER), load_plan(PLAN)
    check_fits(cluster, plan, free_mb=4096)  # 3 nodes and 4 processes: about 3.0 GiB
    with pytest.raises(SpecError, match=r"3 fake nodes .* 4 actor processes \(about 3\.0 GiB\).* 1\.0 GiB"):
        check_fits(cluster, plan, free_mb=1024)
    big = write("big.yaml", CLUSTER.read_text() + "  - {gpu_type: cpu-a, nodes: 10, gpus_per_node: 2}\n")
    res = cli("run", str(PLAN), "--cluster", str(big), "--workload", str(WORKLOAD), "--local", "--steps", "1")
    assert res.code == 2 and "13 fake nodes" in res.err and "at most 8 nodes" in res.err, res.err
    assert len(res.err.strip().splitlines()) == 1


# -- on a Ray cluster of fake nodes -----------------------------------------------------------------
@pytest.fixture(scope="module")
def fake_cluster() -> Iterator[Any]:
    pytest.importorskip("ray", reason="ray is part of the runtime extra that make test installs")
    from runtime.local_cluster import start_fake_cluster

    fake = start_fake_cluster(load_cluster(CLUSTER), load_plan(PLAN))
    yield fake
    fake.shutdown()


def _node_labels(address: str) -> dict[str, dict[str, str]]:
    """Ray's own view of the nodes: node id -> labels."""
    import ray

    ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
    try:
        assert all(n["NodeManagerAddress"] == "127.0.0.1" for n in ray.nodes())  # loopback only
        return {n["NodeID"]: n["Labels"] for n in ray.nodes() if n["Alive"]}
    finally:
        ray.shutdown()


def _run(cli: Callable[..., Any], plan: Path, workload: Path, steps: int, out: Path, address: str) -> dict[str, Any]:
    res = cli("run", str(plan), "--cluster", str(CLUSTER), "--workload", str(workload), "--steps", str(steps),
              "--out", str(out), "--address", address, "--json")
    assert res.code == 0, res.err
    return res.json()


def _assert_on_plan_nodes(summary: dict[str, Any], labels: dict[str, dict[str, str]], plan: dict[str, Any]) -> None:
    """Every actor on a node of its group's type and on the node the plan gave its group."""
    placement = summary["placement"]
    groups = {f"rollout{i}": g for i, g in enumerate(plan["rollout"])} | {"trainer": plan["trainer"]}
    for actor in placement["actors"]:
        group, node = groups[actor["group"]], labels[actor["ray_node"]]
        assert node[TYPE_LABEL] == group["gpu_type"], actor
        assert int(node[NODE_LABEL]) in group["nodes"] and int(node[NODE_LABEL]) == actor["plan_node"], actor
    engines = [len(g["engines"]) for g in placement["groups"] if g["role"] == "rollout"]
    assert engines == [g["instances"] for g in plan["rollout"]]
    assert placement["pinned_to_nodes"] is True


def test_two_type_plan_runs_as_planned_and_fidelity_reports_each_group(fake_cluster: Any, cli: Callable[..., Any],
                                                                       tmp_path: Path) -> None:
    out = tmp_path / "run"
    summary = _run(cli, PLAN, WORKLOAD, STEPS, out, fake_cluster.address)
    plan = json.loads(PLAN.read_text())
    _assert_on_plan_nodes(summary, _node_labels(fake_cluster.address), plan)
    names = [a["name"] for a in summary["placement"]["actors"]]
    assert names == ["engine0", "engine1", "engine2", "trainer0"]
    rewards = [json.loads(line)["mean_reward"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    print(f"\ntwo-type: reward {summary['eval_before']:.3f} -> {summary['eval_after']:.3f}, training reward "
          f"{sum(rewards[:10]) / 10:.3f} -> {sum(rewards[-10:]) / 10:.3f}, {summary['seconds']:.1f} s")
    assert summary["steps"] == STEPS and summary["mode"] == "async" and summary["batch"] == [16, 16]
    assert summary["not_applied"] == ["trainer recompute selective: activations are kept; same gradients, more memory"]
    assert summary["eval_after"] > 3 * summary["eval_before"]
    assert sum(rewards[-10:]) > sum(rewards[:10])
    assert summary["max_staleness"] <= summary["staleness_bound"] == 2
    # no sample lost or trained twice: every step trained 16 whole groups, none twice
    assert summary["samples_trained"] == STEPS * 256
    assert summary["samples_regenerated"] == summary["duplicates_dropped"] == 0
    groups = [uid for line in (out / "metrics.jsonl").read_text().splitlines() for uid in json.loads(line)["groups"]]
    assert len(groups) == len(set(groups)) == STEPS * 16
    phases = json.loads((out / "phases.json").read_text())["groups"]
    assert set(phases) == {"rollout0", "rollout1", "trainer"} and phases["trainer"]["train"]["intervals"] == STEPS

    res = cli("fidelity", str(out))
    assert res.code == 0, res.err
    print(res.out)
    for group, phase in [("rollout0", "decode"), ("rollout1", "prefill"), ("trainer", "train")]:
        line = next(ln for ln in res.out.splitlines() if ln.split()[:2] == [group, phase])
        predicted, measured = map(float, line.split()[2:4])
        assert predicted > 0 and measured > 0


def _colocated(plan: Any) -> Any:
    from traces import RolloutGroup, TrainerGroup

    return plan.model_copy(update={"mode": "colocated", "staleness": 0,
                                   "rollout": (RolloutGroup(gpu_type="cpu-a", instances=1, nodes=(1,)),),
                                   "trainer": TrainerGroup(gpu_type="cpu-a", dp=1, nodes=(1,))})


@pytest.mark.parametrize("mode", ["sync", "colocated"])
def test_sync_and_colocated_plans_run_and_are_recorded_as_such(mode: str, fake_cluster: Any, cli: Callable[..., Any],
                                                               write: Callable[[str, str], Path],
                                                               tmp_path: Path) -> None:
    base = load_plan(PLAN)
    if mode == "sync":  # one engine in each of the two rollout groups, trainer on cpu-b
        plan = base.model_copy(update={"mode": "sync", "staleness": 0, "rollout": tuple(
            g.model_copy(update={"instances": 1}) for g in base.rollout)})
    else:
        plan = _colocated(base)
    plan_file = write(f"{mode}.json", plan.to_json())
    workload = write(f"{mode}.yaml", WORKLOAD.read_text().replace("mode: async", f"mode: {mode}")
                     .replace("staleness: 2", "staleness: 0").replace("prompts_per_step: 16", "prompts_per_step: 4")
                     .replace("group_size: 16", "group_size: 8"))
    out = tmp_path / mode
    summary = _run(cli, plan_file, workload, 4, out, fake_cluster.address)
    _assert_on_plan_nodes(summary, _node_labels(fake_cluster.address), json.loads(plan.to_json()))
    assert summary["mode"] == mode and summary["steps"] == 4 and summary["max_staleness"] == 0
    assert json.loads((out / "placement.json").read_text())["mode"] == mode
    assert json.loads((out / "run.json").read_text())["mode"] == mode
    assert load_plan(out / "plan.json").mode == mode
    assert summary["samples_trained"] == 4 * 32 and summary["samples_regenerated"] == 0
    if mode == "colocated":  # the engine and the trainer rank share node 1's one bundle
        actors = summary["placement"]["actors"]
        assert {a["ray_node"] for a in actors} == {actors[0]["ray_node"]} and len(actors) == 2
