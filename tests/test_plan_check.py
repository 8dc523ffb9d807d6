"""Whole-plan validation (traces.plan_check), shared by validate, simulate, plan and run: one line, every problem."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.candidates import candidates
from traces import Cluster, CostModel, Plan, RolloutGroup, SpecError, TrainerGroup, Workload, get_model
from traces.lengths import LengthDist
from traces.plan_check import check_plan, plan_problems

CLUSTER = Cluster(name="c", node_groups=({"gpu_type": "H800", "nodes": 2, "gpus_per_node": 8},
                                         {"gpu_type": "H20", "nodes": 2, "gpus_per_node": 8}))


def _workload(model: str = "qwen2.5-7b", **kw: object) -> Workload:
    base: dict[str, object] = {"model": get_model(model), "prompts_per_step": 8, "group_size": 4,
                               "prompt_len": LengthDist(kind="fixed", value=64),
                               "response_len": LengthDist(kind="fixed", value=64), "staleness": 2}
    return Workload(**{**base, **kw})


def _plan(rollout: tuple[RolloutGroup, ...] = (RolloutGroup(gpu_type="H20", tp=4, instances=4),),
          trainer: TrainerGroup | None = None, **kw: object) -> Plan:
    return Plan(mode=kw.pop("mode", "async"), staleness=kw.pop("staleness", 2), rollout=rollout,  # type: ignore[arg-type]
                trainer=trainer or TrainerGroup(gpu_type="H800", dp=8), **kw)


def test_a_plan_that_fits_passes() -> None:
    assert plan_problems(CLUSTER, _workload(), _plan()) == []


@pytest.mark.parametrize(("plan", "workload", "message"), [
    (_plan((RolloutGroup(gpu_type="L40S", instances=1),)), _workload(), "uses L40S GPUs but cluster 'c' has none"),
    (_plan((RolloutGroup(gpu_type="H20", instances=17),)), _workload(), "uses 17 H20 GPUs but cluster 'c' has 16"),
    (_plan(trainer=TrainerGroup(gpu_type="H800", tp=16)), _workload("llama-3.1-70b"),
     "trainer TP 16 exceeds the 8 GPUs per H800 node"),
    (_plan((RolloutGroup(gpu_type="H20", tp=8, instances=2),)), _workload(),
     "rollout group 0 TP 8 does not divide qwen2.5-7b's 28 attention heads"),
    (_plan((RolloutGroup(gpu_type="H20", tp=4, instances=2, nodes=(9,)),)), _workload(),
     "lists node 9, but cluster 'c' has nodes 0-3"),
    (_plan((RolloutGroup(gpu_type="H20", tp=4, instances=2, nodes=(0,)),)), _workload(),
     "places H20 work on nodes of type H800"),
    (_plan((RolloutGroup(gpu_type="H20", tp=4, instances=4, nodes=(2,)),)), _workload(),
     "needs 16 GPUs but its 1 node(s) hold 8"),
    (_plan((RolloutGroup(gpu_type="H800", tp=4, instances=2, nodes=(1,)),),
           TrainerGroup(gpu_type="H800", dp=8, nodes=(1,))), _workload(),
     "node 1 is listed by both the trainer and rollout group 0"),
    (_plan(), _workload(mode="sync", staleness=0), "asks mode sync but the plan was built for async"),
    (_plan(), _workload(staleness=1), "asks staleness 1 but the plan was built for 2"),
    (_plan(), _workload(group_size=1), "GRPO needs group_size >= 2"),
])
def test_each_rule_is_refused_in_one_line(plan: Plan, workload: Workload, message: str) -> None:
    with pytest.raises(SpecError, match=message.replace("(", r"\(").replace(")", r"\)")) as err:
        check_plan(CLUSTER, workload, plan)
    assert "\n" not in str(err.value)


def test_every_problem_is_listed_at_once() -> None:
    plan = _plan((RolloutGroup(gpu_type="H20", tp=8, instances=3),), TrainerGroup(gpu_type="H800", dp=1, tp=16))
    problems = plan_problems(CLUSTER, _workload(staleness=0), plan)
    assert len(problems) == 5, problems  # 24 H20 > 16; TP8 vs 28 heads; trainer TP16 > 8 and vs heads; staleness


def test_engine_groups_may_pack_onto_common_nodes_when_they_fit() -> None:
    both = (RolloutGroup(gpu_type="H20", tp=4, instances=1, nodes=(2,)),
            RolloutGroup(gpu_type="H20", tp=2, instances=2, nodes=(2,)))
    assert plan_problems(CLUSTER, _workload(), _plan(both)) == []
    over = (*both, RolloutGroup(gpu_type="H20", tp=1, instances=1, nodes=(2,)))
    assert any("need 9 GPUs but those nodes hold 8" in p for p in plan_problems(CLUSTER, _workload(), _plan(over)))


def test_the_planner_offers_only_tp_degrees_the_model_splits_over() -> None:
    cand = candidates(CostModel.roofline_only(), CLUSTER, _workload())
    assert {o.tp for o in cand.engines} == {1, 2, 4}  # 28 heads / 4 KV heads: no TP 8
    assert {t.tp for t in cand.trainers} <= {1, 2, 4}


def test_validate_refuses_a_plan_its_cluster_cannot_hold(cli, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    c = tmp_path / "c.yaml"
    c.write_text("name: small\nnode_groups:\n  - {gpu_type: H800, nodes: 1}\n")
    p = tmp_path / "p.json"
    p.write_text(_plan().to_json())
    res = cli("validate", "--cluster", str(c), "--plan", str(p))
    assert res.code == 2 and len(res.err.strip().splitlines()) == 1
    assert "uses H20 GPUs but cluster 'small' has none" in res.err
