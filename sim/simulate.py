"""Wire one deployment plan into a simpy environment and run it for a number of trainer steps."""

from __future__ import annotations

import gc
import itertools
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import numpy as np
import simpy

from sim import reference as ref
from sim.controller import Controller
from sim.decode_tables import DecodeTable, PrefillCurve
from sim.engine import Engine
from sim.fleet import Fleet
from sim.recorder import Recorder
from sim.result import SimResult
from sim.samples import Samples
from sim.tool_calls import ToolCalls
from sim.trainer import Trainer
from traces import Cluster, CostModel, GpuType, ModelSpec, Plan, SpecError, Workload
from traces.costmodel.rl import colocated_resident_bytes, colocated_trainer_fits, trainer_step_seconds
from traces.episodes import Episodes
from traces.links import sync_path_bytes_per_s, trainer_network
from traces.plan import RolloutGroup
from traces.plan_check import check_plan
from traces.pricing import plan_price_per_hour
from traces.progress import bar
from traces.records import settled, steady_state, warm_steps
from traces.staleness import lag_bound

MAX_SAMPLES = 20_000_000  # lengths are drawn up front: bound the memory a bad input can ask for


@dataclass(frozen=True)
class _EngineSpec:
    group: RolloutGroup
    name: str
    max_batch: int
    kv_tokens: float
    decode: DecodeTable
    prefill: PrefillCurve
    mean_iteration_s: tuple[float, ...]  # [b]: one iteration of b mean-length samples (router)


def _engine_specs(cm: CostModel, cluster: Cluster, workload: Workload, plan: Plan) -> list[_EngineSpec]:
    model = workload.model
    # colocated: trainer states the plan keeps in HBM take KV cache from the engine sharing the GPU
    resident = colocated_resident_bytes(workload, plan.trainer, plan.offload) if plan.mode == "colocated" else 0.0
    specs = []
    for gi, g in enumerate(plan.rollout):
        cap_running = plan.running_cap(g, cm.efficiency.max_num_seqs)  # the plan's cap, else vLLM's default
        gpu = cluster.gpu(g.gpu_type)
        kv = float(cm.kv_capacity_tokens(gpu, model, g.tp, g.ep, resident))
        if kv < workload.max_seq_len:
            kept = " next to the trainer states kept in HBM (plan offload)" if resident else ""
            raise SpecError(
                f"a {g.gpu_type} TP{g.tp} engine holds {int(kv)} KV tokens{kept}, less than one "
                f"{workload.max_seq_len}-token sample of {model.name}; raise tp, offload more or use larger GPUs"
            )
        key = (id(cm), gpu, model, g.tp, g.ep, cap_running, kv, g.enforce_eager, g.cuda_graph_max_batch,
               workload.prompt_len.expected(), workload.response_len.expected())
        kind = _KINDS.get(key)
        if kind is None or kind[0] is not cm:  # an id is only the same cost model while that one lives
            if len(_KINDS) >= MAX_KINDS:
                _KINDS.clear()
            kind = _KINDS[key] = (cm, *_kind(cm, gpu, model, g, cap_running, kv, workload))
        _, decode, prefill, iteration = kind
        for i in range(g.instances):
            specs.append(_EngineSpec(g, engine_name(g, gi, i), cap_running, kv, decode, prefill, iteration))
    return specs


# The tables of each kind of engine, kept between runs: a planner's request simulates tens of plans
# on the same few kinds (the tables are a pure function of the key, so a run reads the same values
# whether it built them or found them; DecodeTable and PrefillCurve are immutable).
MAX_KINDS = 256
_KINDS: dict[tuple[object, ...], tuple[CostModel, DecodeTable, PrefillCurve, tuple[float, ...]]] = {}


def _kind(cm: CostModel, gpu: GpuType, model: ModelSpec, g: RolloutGroup, cap_running: int, kv: float,
          workload: Workload) -> tuple[DecodeTable, PrefillCurve, tuple[float, ...]]:
    """One kind of engine's decode table, prefill curve and mean-batch iteration seconds (the router's)."""
    decode = DecodeTable.build(cm, gpu, model, g.tp, cap_running, kv, ep=g.ep, enforce_eager=g.enforce_eager,
                               graph_max_batch=g.cuda_graph_max_batch)
    prefill = PrefillCurve.build(cm, gpu, model, g.tp, kv, workload.prompt_len.expected(), ep=g.ep)
    mean = workload.prompt_len.expected() + workload.response_len.expected() / 2
    iteration = (0.0, *(decode.total(b, min(kv, b * mean), 1) for b in range(1, cap_running + 1)))
    return decode, prefill, iteration


def _step_costs(cm: CostModel, cluster: Cluster, workload: Workload, plan: Plan
                ) -> Callable[[int], tuple[float, float]]:
    t = plan.trainer
    kw = {"zero_stage": t.zero_stage, "recompute": t.recompute, "ep": t.ep, **trainer_network(cluster, plan)}

    gpu = cluster.gpu(t.gpu_type)
    memo: dict[int, tuple[float, float]] = {}  # steps of fixed-length samples repeat their token count
    minibatches = workload.ppo_minibatches // workload.stream_chunks  # per chunk: each is whole minibatches

    def step_seconds(tokens: int) -> tuple[float, float]:
        if tokens not in memo:
            logprob, train = trainer_step_seconds(cm, gpu, workload, t.dp, t.tp, t.pp, tokens,
                                                  minibatches=minibatches, **kw)
            memo[tokens] = (float(logprob), float(train))
        return memo[tokens]

    return step_seconds


def simulate(
    cluster: Cluster, workload: Workload, plan: Plan, cost_model: CostModel | None = None, *, steps: int = 10,
    seed: int = 0, token_level: bool = False, record_queue: bool = True, wall_seconds: float | None = None,
    until_settled: bool = False,
) -> SimResult:
    """Simulate `plan` running `workload` on `cluster` until the trainer finishes `steps` steps.

    `wall_seconds` lowers the run's wall-clock bound (a planner's request has its own clock).
    `until_settled`: `steps` is a cap; the run ends at the first step where its steady rate has
    settled (traces.records.settled; the result's `settled` says whether it did). The lengths drawn
    depend on the cap, so it is the same run as `steps=cap` cut short, not as `steps=` its length."""
    if steps < 1:
        raise SpecError(f"steps must be at least 1, got {steps}")
    # the token-level reference keeps the collector on: its per-sample objects make cycles, hundreds
    # of thousands per step
    with nullcontext() if token_level else _cycle_collector_paused():
        return _simulate(cluster, workload, plan, cost_model, steps, seed, token_level, record_queue, wall_seconds,
                         until_settled)


@contextmanager
def _cycle_collector_paused() -> Iterator[None]:
    """Hold Python's cyclic garbage collector off while a fast-path simulation runs (restored after).

    The run frees its objects by reference counting; its cycles (engines and their simpy processes)
    are a few thousand objects whatever its length (8k at 1024 GPUs), collected after it. A full
    collection walks every object the process holds (about 0.1 s with numba, scipy and pandas
    loaded) and landed in one run in three.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _simulate(cluster: Cluster, workload: Workload, plan: Plan, cost_model: CostModel | None, steps: int, seed: int,
              token_level: bool, record_queue: bool, wall_seconds: float | None, until_settled: bool) -> SimResult:
    cm = cost_model or CostModel()
    check_plan(cluster, workload, plan)
    env = simpy.Environment()
    rec = Recorder() if wall_seconds is None else Recorder.bounded(wall_seconds)
    batch = workload.samples_per_step
    eta = plan.staleness  # Plan guarantees 0 outside async mode
    chunk = batch // workload.stream_chunks if workload.stream_chunks > 1 else 0
    total = _samples_to_draw(workload, batch * (steps + lag_bound(eta) + 1))
    if total > MAX_SAMPLES:
        raise SpecError(f"simulating {steps} steps of {batch} samples would draw {total:,} samples (at most "
                        f"{MAX_SAMPLES:,}); simulate fewer steps or a smaller batch")
    rng = np.random.default_rng(seed)
    prompts = workload.prompt_len.sample(rng, total)
    responses = workload.response_len.sample(rng, total)
    agentic = workload.agentic
    episodes = None if agentic is None else Episodes.draw(agentic, workload.response_len, responses, seed)
    specs = _engine_specs(cm, cluster, workload, plan)
    interruptible = workload.interrupts(plan.mode)
    dapo = workload.dynamic_sampling
    passes = None if dapo is None else _group_passes(workload, total, seed)
    filtering = {"passes": passes, "oversample": 1.0 if dapo is None else dapo.oversample}
    if token_level:
        ctl = ref.Controller(env, batch, eta, prompts, responses, chunk, **filtering)
        engines = _reference_engines(env, rec, ctl, workload, specs, interruptible,
                                     None if episodes is None else ref.ToolCalls(env, episodes))
    else:
        samples = Samples(prompts, responses, episodes=episodes is not None)
        tools = None if episodes is None else ToolCalls(env, samples, episodes, workload.reward_seconds)
        ctl = Controller(env, batch, eta, samples, chunk, **filtering, tools=tools)
        fleet = Fleet(env, ctl.samples)
        if tools is not None:
            tools.homes = fleet
        engines = [
            Engine(env, s.name, _group_key(s.group), s.decode, s.prefill, s.max_batch, s.kv_tokens, ctl, rec, fleet,
                   workload.reward_seconds, mean_iteration_s=s.mean_iteration_s, interruptible=interruptible)
            for s in specs
        ]
        fleet.setup(ctl, rec)
    n_engines = len(engines)
    ctl.request_dispatch()
    sync_s = float(cm.sync(cluster.gpu(plan.trainer.gpu_type), workload.model, n_engines,
                           sync_path_bytes_per_s(cluster, plan), workload.lora_rank).seconds)

    def push(version: int, ready_at: float) -> None:
        if not token_level:
            fleet.push(version, ready_at)
            return
        for e in engines:
            e.request_update(version, ready_at)

    trainer = Trainer(env, ctl, rec, steps, _step_costs(cm, cluster, workload, plan), sync_s, push,
                      switch_seconds=_switch_seconds(cm, cluster, workload, plan), chunks=workload.stream_chunks,
                      stop=(lambda: settled(rec.step_ends, rec.step_samples, eta)) if until_settled else None)
    if record_queue:
        env.process(_sample_queue(env, ctl, engines, rec, trainer, steps))
    with bar(steps, "simulating", unit="step") as progress:
        trainer.on_step = progress.update
        try:
            env.run(until=trainer.done)
        except RuntimeError as exc:  # simpy: no events left, the trainer still waiting
            if ctl.ledger.admitted < ctl.ledger.total:
                raise
            raise _ran_out(ctl, len(rec.step_ends), steps) from exc
    if isinstance(ctl, Controller):
        fleet.flush()
        ctl.deliver()
        rec.staleness_tokens = ctl.samples.staleness_tokens()
    return _result(rec, ctl, engines, plan, cluster, env.now, trainer.stopped if until_settled else None)


def _samples_to_draw(workload: Workload, trained: int) -> int:
    """Samples drawn up front: those `trained` needs, and with dynamic sampling the dropped ones too
    (in expectation generated_per_trained times as many; half again and a batch more spare)."""
    if workload.dynamic_sampling is None:
        return trained
    return math.ceil(trained * workload.generated_per_trained * 1.5) + workload.samples_per_step


def _group_passes(workload: Workload, total: int, seed: int) -> np.ndarray:
    """Whether each sample's group passes dynamic sampling's filter: groups are `group_size` consecutive
    ids (admitted together), each passing with the pass rate, drawn from a stream of its own.
    A dropped group's samples leave as each completes, not once the last one does (a simplification)."""
    assert workload.dynamic_sampling is not None
    groups = -(-total // workload.group_size)
    keep = np.random.default_rng([seed, 1]).random(groups) < workload.dynamic_sampling.pass_rate
    return np.repeat(keep, workload.group_size)[:total]


def _reference_engines(
    env: simpy.Environment, rec: Recorder, ctl: ref.Controller, workload: Workload, specs: list[_EngineSpec],
    interruptible: bool, tools: ref.ToolCalls | None,
) -> list[ref.Engine]:
    """The token-level reference: per-sample objects, one event per decode iteration."""

    def finish(done: list[ref.Sample]) -> None:
        if workload.reward_seconds > 0:
            env.timeout(workload.reward_seconds).callbacks.append(lambda _ev: ctl.completed(done))
        else:
            ctl.completed(done)

    engines = [ref.Engine(env, s.name, _group_key(s.group), s.decode, s.prefill, s.max_batch, s.kv_tokens, ctl, rec,
                          finish, mean_iteration_s=s.mean_iteration_s, interruptible=interruptible, tools=tools)
               for s in specs]
    return engines


def _switch_seconds(cm: CostModel, cluster: Cluster, workload: Workload, plan: Plan) -> float:
    """Colocated plans hand the GPUs from engines to trainer and back every step."""
    if plan.mode != "colocated":
        return 0.0
    t = plan.trainer
    engine_tp = max(g.tp for g in plan.rollout)
    gpu = cluster.gpu(t.gpu_type)
    if plan.offload.engine_sleep == 0 and not colocated_trainer_fits(cm, gpu, workload, t, plan.offload):
        raise SpecError(f"offload: engine_sleep 0 keeps the engine's {cm.efficiency.engine_memory_fraction:.0%} of "
                        f"each {t.gpu_type} and the trainer does not fit in the rest; set engine_sleep 1 or 2")
    return float(cm.colocate_switch(gpu, workload.model, engine_tp, t.dp, t.tp, t.pp, zero_stage=t.zero_stage, ep=t.ep,
                                    offload=plan.offload.trainer_parts, engine_sleep=plan.offload.engine_sleep,
                                    lora_rank=workload.lora_rank).seconds)


def engine_name(g: RolloutGroup, group: int, index: int) -> str:
    """The timeline name of engine `index` of the plan's rollout group `group` (sim.fidelity maps it back)."""
    return f"{g.gpu_type}-tp{g.tp}-g{group}-e{index}"


def _group_key(g: RolloutGroup) -> str:
    return f"rollout:{g.gpu_type}:tp{g.tp}"


def _ran_out(ctl: Controller | ref.Controller, done: int, steps: int) -> SpecError:
    return SpecError(f"dynamic_sampling: the {ctl.ledger.total:,} samples drawn ran out after {done} of {steps} "
                     "steps (pass_rate too low for this seed); raise pass_rate or simulate fewer steps")


def _sample_queue(env: simpy.Environment, ctl: Controller | ref.Controller, engines: list[Engine] | list[ref.Engine],
                  rec: Recorder, trainer: Trainer, steps: int):  # type: ignore[no-untyped-def]
    period = 1.0
    while True:
        if isinstance(ctl, Controller):
            ctl.deliver()  # completions filed until now
        ledger = ctl.ledger
        if trainer.waiting and ledger.admitted >= ledger.total and not any(ledger.in_flight.values()):
            raise _ran_out(ctl, len(rec.step_ends), steps)  # nothing left to complete: it would wait forever
        waiting = sum(e.queued() for e in engines)
        in_flight = sum(ctl.ledger.in_flight.values())
        rec.queue.append((env.now, waiting, in_flight, ctl.ledger.buffered))
        yield env.timeout(period)
        period = max(1.0, env.now / 200)  # about 200 points per run whatever its length


def _result(
    rec: Recorder, ctl: Controller | ref.Controller, engines: list[Engine] | list[ref.Engine], plan: Plan,
    cluster: Cluster, end: float, settled_run: bool | None = None,
) -> SimResult:
    steps = len(rec.step_ends)
    trained = np.concatenate(rec.trained) if rec.trained else np.empty(0, np.int64)
    trained.flags.writeable = False
    # after the start-up transient, as a measured run's throughput is taken (traces.records)
    warm = warm_steps(plan.staleness, steps)
    samples, window = steady_state(rec.step_ends, rec.step_samples, plan.staleness)
    tokens, _ = steady_state(rec.step_ends, rec.step_tokens, plan.staleness)
    ends = [0.0, *rec.step_ends]
    step_times = tuple(b - a for a, b in itertools.pairwise(ends))
    util: dict[str, float] = {}
    members: dict[str, list[str]] = {}
    for e in engines:
        members.setdefault(e.group, []).append(e.name)
    busy = rec.busy  # summed once
    for group, names in members.items():
        util[group] = sum(busy[n] for n in names) / (len(names) * end) if end > 0 else 0.0
    util["trainer"] = busy["trainer"] / end if end > 0 else 0.0
    price = plan_price_per_hour(cluster, plan)  # by the node groups the plan sits in (traces.pricing)
    return SimResult(
        samples_per_s=samples / window if window > 0 else 0.0,
        tokens_per_s=tokens / window if window > 0 else 0.0,
        mean_step_s=float(np.mean(step_times[warm:])) if step_times[warm:] else 0.0,
        step_times=step_times,
        utilization=util,
        staleness_hist=dict(sorted(rec.staleness_tokens.items())),
        cost_per_hour=price,
        trained_samples=len(trained),
        trained_ids=trained,
        admitted=ctl.ledger.admitted,
        in_flight=sum(ctl.ledger.in_flight.values()) + ctl.ledger.buffered,
        events=rec.events,
        sim_seconds=end,
        mode=plan.mode,
        recorder=rec,
        queue_rows=tuple(rec.queue),
        dropped=ctl.ledger.dropped,
        settled=settled_run,
    )
