"""`rlfleet run --local`: a Ray cluster of fake nodes on loopback that mirrors a cluster file.

Every node of the cluster file becomes one raylet on this machine (ray.cluster_utils.Cluster): node
i of a group of GPU type T with g GPUs per node has g CPUs (CPU bundles stand in for its GPUs),
the resources `accelerator_type:T` (as Ray declares on a GPU node) and `rlfleet_node:i`, and the
labels `rlfleet.io/gpu-type: T`, `rlfleet.io/node: i`. So a plan's placement groups land exactly as
on the real cluster (runtime.placement), and tests can check every actor's node.

A cluster or plan too large for this machine is refused before anything starts, with what it would
need (`check_fits`): never shrunk, which would run another plan than the one given.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from runtime.ray_start import LOOPBACK_ENV
from traces import Cluster, Plan, SpecError
from traces.placement import NODE_LABEL, NODE_RESOURCE, TYPE_LABEL, TYPE_RESOURCE

# What this machine can host: each fake node is a raylet with its agents (and the head also the GCS),
# each plan device an actor process. Resident memory measured here (ps): a raylet ~30 MB, its
# dashboard agent ~130 MB and runtime-env agent; a torch engine actor ~560 MB (shared libraries
# counted). Process limits: past ~8 raylets and 16 actors on 2 cores start-up alone takes minutes.
MAX_NODES = 8
MAX_PROCESSES = 16
RAYLET_MB, ACTOR_MB = 300, 550
LOOPBACK = "127.0.0.1"  # every fake node listens on loopback only (never expose a Ray cluster)
OBJECT_STORE_BYTES = 96 * 1024**2  # per fake node: the batches and weights of tiny models; Ray's default is 30% of RAM


@dataclass(frozen=True)
class FakeNode:
    index: int  # the node's index in the cluster file (nodes numbered group by group)
    gpu_type: str
    devices: int

    def args(self) -> dict[str, object]:
        """ray.cluster_utils.Cluster.add_node arguments of this node."""
        return {"num_cpus": self.devices, "num_gpus": 0, "object_store_memory": OBJECT_STORE_BYTES,
                "node_ip_address": LOOPBACK,
                "resources": {TYPE_RESOURCE.format(self.gpu_type): 1.0, NODE_RESOURCE.format(self.index): 1.0},
                "labels": {TYPE_LABEL: self.gpu_type, NODE_LABEL: str(self.index)}}


def fake_nodes(cluster: Cluster) -> list[FakeNode]:
    """One fake node per node of the cluster file, in its numbering, with its canonical GPU type."""
    nodes, first = [], 0
    for group in cluster.node_groups:
        name = cluster.resolve(group.gpu_type).name
        nodes += [FakeNode(first + k, name, group.gpus_per_node) for k in range(group.nodes)]
        first += group.nodes
    return nodes


def plan_processes(plan: Plan) -> int:
    """Actor processes the plan starts: one per engine and per trainer rank (TP ranks of a torch engine
    are refused before this; a vLLM engine's TP workers are its own processes, counted per device)."""
    return sum(g.gpus for g in plan.rollout) + plan.trainer.gpus


def available_mb() -> float:
    """This machine's available memory (Linux MemAvailable), or infinity where it cannot be read."""
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("inf")


def check_fits(cluster: Cluster, plan: Plan, free_mb: float | None = None) -> None:
    """SpecError, with what the run would need, if this machine cannot host the fake cluster and the plan."""
    nodes, procs = len(fake_nodes(cluster)), plan_processes(plan)
    need_mb = nodes * RAYLET_MB + procs * ACTOR_MB
    free = available_mb() if free_mb is None else free_mb
    if nodes > MAX_NODES or procs > MAX_PROCESSES or need_mb > free:
        raise SpecError(f"--local would start {nodes} fake nodes (cluster '{cluster.name}') and {procs} actor "
                        f"processes (about {need_mb / 1024:.1f} GiB); this machine hosts at most {MAX_NODES} nodes "
                        f"and {MAX_PROCESSES} processes and has {free / 1024:.1f} GiB available: use a smaller "
                        "cluster file and plan, or --address a real Ray cluster")


def start_fake_cluster(cluster: Cluster, plan: Plan) -> Any:
    """The fake cluster of `cluster`'s nodes, started (a ray.cluster_utils.Cluster; `.address` to join it,
    `.shutdown()` to stop it); this process is not connected to it."""
    check_fits(cluster, plan)
    os.environ.setdefault(LOOPBACK_ENV, "0")  # loopback only, read when ray is first imported (runtime.ray_start)
    from ray.cluster_utils import Cluster as RayCluster

    head, *rest = fake_nodes(cluster)
    fake = RayCluster(initialize_head=True, head_node_args={**head.args(), "include_dashboard": False})
    try:
        for node in rest:
            fake.add_node(**node.args())
        fake.wait_for_nodes()
    except BaseException:
        fake.shutdown()
        raise
    return fake


@contextmanager
def local_cluster(cluster: Cluster, plan: Plan) -> Iterator[Any]:
    """Start the fake cluster and connect this process to it; disconnect and stop it on exit."""
    os.environ.setdefault(LOOPBACK_ENV, "0")
    import ray

    if ray.is_initialized():
        raise SpecError("--local starts its own Ray cluster, but this process is already connected to one")
    fake = start_fake_cluster(cluster, plan)
    try:
        ray.init(address=fake.address, log_to_driver=False, logging_level=logging.WARNING)
        try:
            yield fake
        finally:
            ray.shutdown()
    finally:
        fake.shutdown()
