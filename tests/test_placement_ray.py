"""Plan groups land on Ray nodes of their GPU type (a real Ray cluster of fake nodes on loopback)."""

from __future__ import annotations

import pytest

ray = pytest.importorskip("ray", reason="ray is part of the runtime extra that make test installs")


@ray.remote(num_cpus=0)
class Where:
    def node(self) -> str:
        return ray.get_runtime_context().get_node_id()


def test_each_actor_sits_on_a_node_of_its_gpu_type() -> None:
    from ray.cluster_utils import Cluster as RayCluster

    from runtime.placement import TYPE_RESOURCE, place
    from traces import Plan, RolloutGroup, SpecError, TrainerGroup

    # two H20 nodes and one H800 node, each declaring its type the way Ray does on GPU machines
    cluster = RayCluster(initialize_head=True, head_node_args={
        "num_cpus": 4, "resources": {TYPE_RESOURCE.format("H800"): 1}, "include_dashboard": False})
    h20 = [cluster.add_node(num_cpus=4, resources={TYPE_RESOURCE.format("H20"): 1}) for _ in range(2)]
    try:
        ray.init(address=cluster.address, log_to_driver=False)
        assert all(n["NodeManagerAddress"] == "127.0.0.1" for n in ray.nodes())  # loopback only
        node_type = {n["NodeID"]: next(k.split(":", 1)[1] for k in n["Resources"] if k.startswith("accelerator_type:"))
                     for n in ray.nodes() if n["Alive"]}
        assert sorted(node_type.values()) == ["H20", "H20", "H800"]
        plan = Plan(mode="async", staleness=1, rollout=(RolloutGroup(gpu_type="H20", tp=1, instances=6),),
                    trainer=TrainerGroup(gpu_type="H800", dp=2))
        groups = place(plan, gpus=False)
        actors = {(g.role, i): Where.options(**g.actor_options(i)).remote() for g in groups for i in range(g.actors)}
        where = {key: node_type[ray.get(a.node.remote())] for key, a in actors.items()}
        assert {t for (role, _), t in where.items() if role == "rollout"} == {"H20"}
        assert {t for (role, _), t in where.items() if role == "train"} == {"H800"}
        assert sum(role == "rollout" for role, _ in where) == 6 and sum(role == "train" for role, _ in where) == 2
        # six engines need two H20 nodes' CPUs: both were used
        used = {ray.get(a.node.remote()) for (role, _), a in actors.items() if role == "rollout"}
        assert len(used) == 2 and all(n.node_id in used for n in h20)
        too_big = Plan(mode="async", staleness=1, rollout=(RolloutGroup(gpu_type="L40S", instances=1),),
                       trainer=TrainerGroup(gpu_type="H800", dp=1))
        with pytest.raises(SpecError, match="cannot hold the rollout group"):
            place(too_big, gpus=False, timeout_s=3)
    finally:
        ray.shutdown()
        cluster.shutdown()
