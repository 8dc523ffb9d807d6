"""One run on Ray, from start-up to tear-down: Ray, the plan's placement groups, the fleet, the driver.

`run_on_ray` takes a `RunSetup` (runtime.run_setup) and a plan, whoever built them: the toy task
(runtime.toy) today, a real model and data set later. It uses the Ray this process is connected to
(`rlfleet run --local`'s fake cluster, runtime.local_cluster), else starts a local Ray on loopback
(or joins `address`), and leaves it running for the caller to shut down (`ray.shutdown()`), so
several runs share one start-up. Its actors and placement groups are gone when it returns, or raises.

Every plan group gets its placement group (runtime.placement; with `cluster`, pinned to the plan's
nodes where Ray names them); each rollout group's engines run at the plan's running cap
(`Plan.running_cap`), built by the engine factory given (runtime.engine_factory; torch engines by
default). With an out folder, who ran where is recorded (runtime.placement_record).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from runtime.controller import Controller, LoopConfig
from runtime.engine_factory import EngineFactory, SpecEngines
from runtime.engine_spec import EngineSpec, engine_model
from runtime.fleet import engine_spawner, start_fleet
from runtime.parallel import check_pp
from runtime.placement import place
from runtime.placement_record import describe_placement, write_placement
from runtime.ray_loop import RayLoop
from runtime.ray_start import init_ray
from runtime.records import RunRecorder
from runtime.run_result import Finished
from runtime.run_setup import RunSetup
from runtime.settings import SYNC_TIMEOUT_S, Faults, SyncSettings
from traces import Cluster, Plan


def run_on_ray(plan: Plan, setup: RunSetup, config: LoopConfig, seed: int = 0, max_batch: int = 256,
               interruptible: bool = True, address: str | None = None,
               progress: Callable[[dict[str, Any]], None] | None = None, faults: Faults | None = None,
               sync_timeout_s: float = SYNC_TIMEOUT_S, cluster: Cluster | None = None,
               engines: EngineFactory | None = None, executor: str = "ray", engine: str = "torch") -> Finished:
    """Train `setup` with the plan's engines and trainer ranks as Ray actors and real weight sync.
    `engine`: every rollout group's engines are vLLM or torch engines (runtime.engine_spec).

    Dead engines are replaced; a dead trainer raises `runtime.ray_loop.TrainerLost`, and a setup with
    a checkpoint record continues that run (every trainer rank loads rank 0's file)."""
    import ray

    out, model, tokenizer, record = setup.out, setup.model, setup.tokenizer, setup.record
    check_pp(plan.trainer.pp)  # before Ray starts: its bundles would be taken for dp x tp ranks
    init_ray(plan, address)
    # a Ray cluster with GPUs gets bundles of one GPU each (vLLM and the trainer ranks use them; not run
    # here: no GPU was lent to this work); the fake-node and CPU clusters get CPU bundles
    groups = place(plan, gpus=ray.cluster_resources().get("GPU", 0) >= 1, cluster=cluster)
    loop: RayLoop | None = None
    actors: list[Any] = []
    caps = [plan.running_cap(g, max_batch) for g in plan.rollout]
    # the initial weights the engines load (a vLLM engine: the run folder's copy); a resumed run's come by sync
    weights = engine_model(engine, model, setup.model_dir or (out / "initial_model" if out else None))
    factory = engines or SpecEngines(EngineSpec(engine, weights, tokenizer.eos_id, tokenizer.pad_id, max_batch,
                                                interruptible))
    spawn = engine_spawner(groups, weights, tokenizer, seed, caps, interruptible, factory)
    try:
        handles, ranks = start_fleet(groups, model, tokenizer, setup.train, seed, max_batch, interruptible,
                                     timeout_s=sync_timeout_s, spawn=spawn, tp=plan.trainer.tp)
        trainer = ranks[0]
        actors = [h.actor for h in handles] + ranks
        where = describe_placement(plan, groups, [h.actor for h in handles], ranks, factory.kind, executor)
        control = Controller(setup.task, tokenizer, config, seed=seed, out_dir=out, clock=time.time,
                             progress=progress, identity=setup.identity)
        if record is not None:
            assert out is not None
            # rank 0 wrote one file; every rank loads it, so the replicas continue equal
            ray.get([rank.load_checkpoint.remote(str(out / record["trainer"])) for rank in ranks])
            control.restore(record["controller"], RunRecorder.resume(out, record["records"]))
        loop = RayLoop(control, handles, trainer, out, spawn=spawn, faults=faults or Faults(),
                       sync=SyncSettings(timeout_s=sync_timeout_s), peers=ranks[1:])
        t0 = time.time()
        loop.run()
        seconds = time.time() - t0
        model.load_state_dict(ray.get(trainer.weights.remote()))
        described = tuple(ray.get([rank.describe.remote() for rank in ranks]))
        engine_actors = tuple(ray.get([h.actor.describe.remote() for h in loop.engines]))
        if out is not None:
            write_placement(out, where)
    finally:
        for actor in (loop.actors() if loop is not None else []) + actors:
            ray.kill(actor)
        groups.remove()
    return Finished(control, model, seconds, described[0]["version"], described[0]["optimizer_steps"],
                    loop.fleet.restarts, described, where, engine_actors)
