"""Ray's start-up for a run: join a cluster, or start a local one on loopback with the plan's GPU-type resources."""

from __future__ import annotations

import logging
import os

from runtime.placement import TYPE_RESOURCE
from traces import Plan
from traces.ray_address import (  # "0": Ray takes 127.0.0.1 as the node address
    LOOPBACK_ENV,
    check_ray_address,
    probe_ray_address,
)

__all__ = ["LOOPBACK_ENV", "init_ray"]


def init_ray(plan: Plan, address: str | None = None, extra_cpus: int = 1) -> None:
    """Join `address`, or start a local Ray on loopback whose node carries the plan's GPU-type resources.

    Loopback: Ray reads LOOPBACK_ENV when it is first imported (ray._private.ray_constants), so it is
    set here before the import; a process that imported ray earlier must set it itself (tests do, in
    conftest). Without it Ray picks this host's external address, unreachable on some machines.
    """
    if address is None:
        os.environ.setdefault(LOOPBACK_ENV, "0")
    else:
        probe_ray_address(check_ray_address(address), "drop --address to run on a local cluster")
    import ray

    if ray.is_initialized():
        return
    if address is not None:
        ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
        return
    need: dict[str, float] = {}
    for group in plan.rollout:
        need[group.gpu_type] = need.get(group.gpu_type, 0) + group.gpus
    need[plan.trainer.gpu_type] = need.get(plan.trainer.gpu_type, 0) + plan.trainer.gpus
    # logical CPUs, one per bundle: the processes share the real cores, Ray only counts. address="local":
    # always a new instance; without it ray.init joins whatever cluster this machine last started
    ray.init(address="local", num_cpus=int(sum(need.values())) + extra_cpus, include_dashboard=False,
             log_to_driver=False, resources={TYPE_RESOURCE.format(t): float(n) for t, n in need.items()})
