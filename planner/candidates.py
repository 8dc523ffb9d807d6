"""What each part of the fleet could do: rollout-engine and trainer options with their rates.

A pool is one node group of the cluster (one GPU type, one node size, one price). Rollout options
are engines of `tp` GPUs inside a node (tp divides the node size) whose KV cache holds at least one
full-length sample. An engine's steady-state samples/s (the cost model's, under the workload's
lengths) grows with the samples it holds, concavely: decode iterations get longer as the batch
grows. It is kept as a piecewise-linear curve up to the batch the KV cache allows, so the MILP can
spread a bounded number of in-flight samples (AReaL's capacity rule) over engines. On-policy
engines get one batch at a time, which thins out as samples finish: their curve is the drain rate
(planner.drain.drain_rates), not the steady state.
Trainer options take whole nodes of one pool (the rest of a node would be stranded), for every
(dp, tp, pp, ep, ZeRO stage, recomputation) that fits in memory; only the fastest per (pool, nodes) is
kept, since the planner would never pick a slower one.
Mixture-of-experts models add expert parallelism (traces.plan_check.ep_shards says which): engines
of TP t with EP 1 or t (data-parallel attention, inside a node), trainers with EP dividing dp x tp
(across nodes once ep exceeds a node). The MILP is unchanged: EP is one more field of an option.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from itertools import product

import numpy as np

from planner import agentic_rate
from planner.drain import DRAWS, LazyDrain, drain_rates, drain_update_seconds, expected_longest
from planner.memo import once
from planner.tail_model import DrainCurve, residual_lengths
from traces import Cluster, CostModel, GpuType, ModelSpec, Workload
from traces.costmodel.rl import trainer_fits, trainer_step_seconds
from traces.plan import engine_seqs
from traces.plan_check import ep_shards, tp_shards
from traces.staleness import admission_cap

ZERO_STAGES = (1, 3)
RECOMPUTE = ("none", "selective", "full")


@dataclass(frozen=True)
class Pool:
    """Identical nodes (node groups of one GPU type, node size, network, label and price, merged):
    `node_ids` are their cluster node indices, in file order."""

    index: int
    gpu: GpuType  # priced as in the cluster file
    nodes: int
    per_node: int
    inter_node_bytes_per_s: float
    node_ids: tuple[int, ...]
    label: str | None

    @property
    def gpus(self) -> int:
        return self.nodes * self.per_node

    @property
    def name(self) -> str:
        return self.gpu.name if self.label is None else f"{self.gpu.name}@{self.label}"


@dataclass(frozen=True)
class EngineOption:
    pool: int
    tp: int
    samples_per_s: float  # one engine, steady state at its full batch
    batch: int  # running sequences its KV cache allows
    price_per_hour: float  # tp GPUs
    # (width, slope): the next `width` in-flight samples add `slope` samples/s each (slopes fall)
    segments: tuple[tuple[float, float], ...]
    tail_seconds: float  # latency of a longest sample decoding alone: the staleness rule's floor
    # seconds per trainer step lost at each segment's load: interruptible, waiting for the new weights
    # plus re-prefilling the KV cache of the samples it holds; not, draining them (planner.tail_model)
    update_seconds: tuple[float, ...] = ()
    ep: int = 1  # expert-parallel ranks (1 or tp)
    # single-turn: its one-shot drain and routing key (planner.tail_model.race), built when first asked for;
    # not compared: the option's other fields and the request decide it (a copy from a worker is the same option)
    drain_source: LazyDrain | None = dataclasses.field(default=None, compare=False)
    # single-turn: the router's key at each segment's load (one decode iteration of that many
    # mean-length samples: sim.simulate's mean_iteration_s), for planner.rate_model's routed loads
    keys: tuple[float, ...] = ()

    @property
    def drain(self) -> DrainCurve | None:
        return None if self.drain_source is None else self.drain_source.curve()

    def derated(self, period: float) -> EngineOption:
        """The rate curve with each step's update pause taken out, for a trainer step of `period` s."""
        if not self.update_seconds or not math.isfinite(period) or period <= 0:
            return self
        keep = [max(0.0, 1.0 - u / period) for u in self.update_seconds]
        segments = tuple((w, s * k) for (w, s), k in zip(self.segments, keep, strict=True))
        slopes = np.minimum.accumulate([s for _, s in segments])  # still concave
        segments = tuple((w, float(s)) for (w, _), s in zip(segments, slopes, strict=True))
        return dataclasses.replace(self, segments=segments, samples_per_s=sum(w * s for w, s in segments))

    def rate(self, load: float) -> float:
        """Samples/s of one engine holding `load` samples (capped at its batch)."""
        out, left = 0.0, load
        for width, slope in self.segments:
            take = min(width, left)
            out, left = out + take * slope, left - take
        return out


@dataclass(frozen=True)
class TrainerOption:
    pool: int
    nodes: int
    dp: int
    tp: int
    pp: int
    zero_stage: int
    recompute: str
    step_seconds: float  # logprob + train + weight sync, one step
    samples_per_s: float
    price_per_hour: float
    switch_seconds: float  # colocated only: one hand-over between engines and trainer
    ep: int = 1  # expert-parallel ranks among dp x tp

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp


@dataclass(frozen=True)
class Candidates:
    pools: tuple[Pool, ...]
    engines: tuple[EngineOption, ...]
    trainers: tuple[TrainerOption, ...]
    samples_per_step: int
    staleness: float
    sync_seconds: float  # the weight-sync estimate inside every trainer option's step (before placement)

    mean_over_max_response: float = 1.0  # E[o] / E[longest o of a cohort of (eta + 1) B samples]
    interruptible: bool = False  # engines take new weights mid-sample (else they drain first)
    # dynamic sampling (traces.workload.DynamicSampling): samples generated per trained one, and how
    # far ahead of what the batch lacks generation may run
    generated_per_trained: float = 1.0
    oversample: float = 1.0

    @property
    def admitted_cap(self) -> float:
        """AReaL's capacity rule (traces.staleness, the simulator's): at most (eta + 1) B samples
        admitted and not yet trained."""
        return float(admission_cap(self.staleness, 0, self.samples_per_step))

    @property
    def tail_ratio(self) -> float:
        """E[o]/E[max o], times the samples generated per trained one (dynamic sampling drops the rest:
        they are in flight too)."""
        return self.mean_over_max_response * self.generated_per_trained

    def in_flight_cap(self, step_seconds: float, rate: float) -> float:
        """Samples in flight the staleness rule lets engines keep busy at `rate` samples/s, with a
        trainer step (logprob, train and weight sync) of `step_seconds`.

        A cohort admitted when version v is published (its engines start it once the weights are
        in) must be trained by step v + eta, which can end no sooner than (eta + 1) periods T = B / z
        after that publication, so its longest sample has W = (eta + 1) T - step_seconds to finish,
        while a mean one takes E[o]/E[max o] of that time (traces.staleness; the simulator's trainer).
        By Little's law the samples in flight are z x mean latency <= (E[o]/E[max o]) ((eta + 1) B
        - z step_seconds), and never more than the capacity rule admits.
        Engines that are not interruptible get the same window: each sample still runs on the
        weights it started with; their drain before each update is a loss per step in their rate
        curve (planner.tail_model), not a smaller cap.
        With dynamic sampling the dropped samples are in flight too: the tail scales by the samples
        generated per trained one (tail_ratio), the capacity rule by its oversample.
        """
        admitted = self.admitted_cap * self.oversample  # dynamic sampling may run ahead (traces.capacity)
        tail = self.tail_ratio * (self.admitted_cap - rate * step_seconds)
        return max(0.0, min(admitted, tail))


def pools_of(cluster: Cluster) -> tuple[Pool, ...]:
    """One pool per kind of node: a cluster written one node per group plans as fast as one group."""
    merged: dict[tuple[object, ...], tuple[GpuType, int, float, list[int], str | None]] = {}
    first = 0
    for g in cluster.node_groups:
        gpu = cluster.group_gpu(g)
        key = (gpu, g.gpus_per_node, g.inter_node_gb_per_s, g.label)
        if key not in merged:
            merged[key] = (gpu, g.gpus_per_node, g.inter_node_gb_per_s * 1e9, [], g.label)
        merged[key][3].extend(range(first, first + g.nodes))
        first += g.nodes
    return tuple(Pool(i, gpu, len(ids), per_node, bw, tuple(ids), label)
                 for i, (gpu, per_node, bw, ids, label) in enumerate(merged.values()))


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def engine_options(cm: CostModel, pools: tuple[Pool, ...], workload: Workload, sync_seconds: float = 0.0
                   ) -> list[EngineOption]:
    out = []
    for pool in pools:
        for tp in _divisors(pool.per_node):
            if tp_shards(workload.model, tp) is not None:
                continue
            for ep in sorted({1, tp}):
                if ep_shards(workload.model, ep, tp, engine=True) is not None:
                    continue
                # the curve depends on the GPU, TP, EP and job alone: once per cost model (planner.memo)
                curve = once(cm, ("engine curve", pool.gpu, tp, ep, workload),
                             lambda g=pool.gpu, t=tp, e=ep: _engine_curve(cm, g, workload, t, e))
                if curve is not None:
                    out.append(_priced(cm, pool, workload, curve, sync_seconds))
    return out


@dataclass(frozen=True)
class _Curve:
    """An engine option's figures that do not depend on its fleet (engine_options)."""

    tp: int
    ep: int
    full: int
    points: np.ndarray
    widths: np.ndarray
    slopes: np.ndarray
    longest: float
    context: float  # mean context of a held sample (the drain loss's, the re-prefill's)
    reprefill: np.ndarray | None  # interruptible: seconds to re-prefill what it holds, at each point
    curve: LazyDrain | None
    keys: tuple[float, ...]


def _engine_curve(cm: CostModel, gpu: GpuType, workload: Workload, tp: int, ep: int) -> _Curve | None:
    model = workload.model
    prompt, response = workload.prompt_len.expected(), workload.response_len.expected()
    square = workload.response_len.expected_square()
    context = prompt + square / (2 * response)  # mean context of a running sample
    episodes = workload.agentic is not None  # multi-turn: the curve is over episodes in flight (planner.agentic_rate)
    if episodes:
        context = agentic_rate.decode_context(workload)
    key_context = prompt + response / 2  # a mean-length sample's, as the router's key (sim.simulate)
    if float(cm.kv_capacity_tokens(gpu, model, tp, ep)) < workload.max_seq_len:
        return None
    full = agentic_rate.full_batch(cm, gpu, workload, tp, ep) if episodes else int(
        cm.generation_rate(gpu, model, tp, prompt_mean=prompt, response_mean=response,
                           response_sq_mean=square, ep=ep).batch)
    if full < 1:
        return None
    points = np.unique(np.r_[2 ** np.arange(int(np.log2(full)) + 1), full])
    held = points.astype(float)  # samples in flight at each point: the running ones, but for episodes
    draws = _draws(workload)
    if episodes and workload.mode == "async":  # the steady state, tool waits by Little's law
        held, rates = agentic_rate.episode_rates(cm, gpu, workload, tp, points, ep)
    elif episodes:  # on-policy: one batch of episodes at a time, drained (planner.episode_drain)
        rates = agentic_rate.on_policy_rates(cm, gpu, workload, tp, points, ep)
    elif workload.mode == "async":
        rates = cm.generation_rate(gpu, model, tp, prompt_mean=prompt, response_mean=response,
                                   response_sq_mean=square, max_num_seqs=points, ep=ep).samples_per_s
    else:
        rates = drain_rates(cm, gpu, workload, tp, points, draws, ep)
    rates = rates / workload.generated_per_trained  # trained samples/s: dynamic sampling drops the rest
    widths = np.diff(np.r_[0.0, held])
    slopes = np.minimum.accumulate(np.diff(np.r_[0.0, rates]) / widths)  # keep the curve concave
    reprefill: np.ndarray | None = None
    curve: LazyDrain | None = None
    keys: tuple[float, ...] = ()
    if workload.interruptible and workload.mode == "async":
        reprefill = cm.prefill(gpu, model, tp, points * context, context, ep).seconds
        if not episodes:  # priced at its routed load (planner.rate_model.raced)
            keys = tuple(np.asarray(cm.decode(gpu, model, tp, held, key_context, ep).seconds, float).tolist())
    if workload.mode != "colocated" and not episodes and workload.dynamic_sampling is None:
        seqs = engine_seqs(None, ep, cm.efficiency.max_num_seqs)  # what the plan's engine accepts (to_plan sets none)
        curve = LazyDrain(cm, gpu, workload, tp, ep, points, draws, full, max(seqs, full))  # planner.rate_model.raced
    longest = (agentic_rate.longest_episode_seconds(cm, gpu, workload, tp, ep) if episodes
               else _longest_sample_seconds(cm, gpu, workload, tp, ep))
    return _Curve(tp, ep, full, points, widths, slopes, longest, context, reprefill, curve, keys)


def _priced(cm: CostModel, pool: Pool, workload: Workload, c: _Curve, sync_seconds: float) -> EngineOption:
    """The option of `c` in `pool`, with each step's update at this fleet's weight-sync time."""
    update: tuple[float, ...] = ()
    if c.reprefill is not None:
        update = tuple((sync_seconds + c.reprefill).tolist())
    elif workload.mode == "async":
        update = drain_update_seconds(cm, pool.gpu, workload, c.tp, c.ep, c.points,
                                      _residuals(workload), c.context, sync_seconds)
    segments = tuple(zip(c.widths.tolist(), c.slopes.tolist(), strict=True))
    return EngineOption(pool.index, c.tp, float((c.widths * c.slopes).sum()), c.full,
                        c.tp * pool.gpu.price_per_gpu_hour, segments, c.longest, update, c.ep, c.curve, c.keys)


@functools.lru_cache(maxsize=16)  # every option of a job draws the same
def _draws(workload: Workload) -> np.ndarray:
    """Seeded response lengths, sorted (the on-policy drain curve's and the drain loss's); read-only."""
    draws = np.sort(workload.response_len.sample(np.random.default_rng(0), DRAWS))
    draws.flags.writeable = False
    return draws


@functools.lru_cache(maxsize=16)
def _residuals(workload: Workload) -> np.ndarray:
    return residual_lengths(_draws(workload))


def _longest_sample_seconds(cm: CostModel, gpu: GpuType, workload: Workload, tp: int, ep: int = 1) -> float:
    """Prefill plus every decode iteration of a longest response, alone on the engine."""
    prompt, longest = workload.prompt_len.expected(), workload.response_len.max
    contexts = prompt + np.linspace(0, longest, 33)
    per_iter = float(np.mean(cm.decode(gpu, workload.model, tp, 1, contexts, ep).seconds))
    return float(cm.prefill(gpu, workload.model, tp, prompt, None, ep).seconds) + longest * per_iter


EVERY_NODE_COUNT_UP_TO = 64  # trainer sizes: every whole-node count up to here, then ~10% steps
NODE_STEP = 1.1


def trainer_node_counts(nodes: int) -> list[int]:
    """Trainer sizes considered for a pool of `nodes` nodes: bounded (~140 at 100k nodes), so a
    huge fleet cannot blow up the MILP, while every size is there for fleets up to 512 GPUs a type."""
    counts = list(range(1, min(nodes, EVERY_NODE_COUNT_UP_TO) + 1))
    while counts[-1] < nodes:
        counts.append(min(nodes, max(counts[-1] + 1, round(counts[-1] * NODE_STEP))))
    return counts


def _layouts(nodes: int, per_node: int, model: ModelSpec, tps: list[int]) -> np.ndarray:
    """(nodes, dp, tp, pp, ep) rows for the trainer sizes of a pool: tp inside a node, pp dividing the
    layers, ep (MoE models) any count of whole ranks the experts split over (traces.plan_check)."""
    eps = [1] if model.moe is None else [e for e in _divisors(model.moe.experts)]
    rows = [(n, dp, tp, pp, ep) for n in trainer_node_counts(nodes) for tp in tps
            for pp in _divisors(min(model.layers, 64)) if (n * per_node) % (tp * pp) == 0
            for dp in [n * per_node // (tp * pp)]
            for ep in eps if ep_shards(model, ep, dp * tp, engine=False) is None]
    return np.array(rows, dtype=np.int64).reshape(-1, 5)


def trainer_options(
    cm: CostModel, pools: tuple[Pool, ...], workload: Workload, sync_seconds: float, max_nodes: int | None = None
) -> list[TrainerOption]:
    """The fastest fitting trainer per (pool, whole-node count); `sync_seconds` is added per step.

    A pool's layouts are priced once per cost model (`_layout_steps`, planner.memo: the marginal values'
    and baselines' fleets share most of their pools with the request's; issue 19, 3.2 s of the
    100,000 x 12 request's profile); the sync, which differs per fleet, is added here, before the
    fastest layout is picked, as it always was (two layouts a sync apart can tie)."""
    batch = workload.samples_per_step
    out = []
    combos = list(product(ZERO_STAGES, RECOMPUTE))
    for pool in pools:
        count = min(pool.nodes, max_nodes or pool.nodes)
        lay, steps = once(cm, ("trainer layouts", pool.gpu, pool.per_node, pool.inter_node_bytes_per_s, count,
                               workload), functools.partial(_layout_steps, cm, pool, count, workload, combos))
        nodes, dp, tp, pp, ep = lay[:, 0], lay[:, 1], lay[:, 2], lay[:, 3], lay[:, 4]
        best_step = np.full(len(lay), np.inf)
        best_combo = np.zeros(len(lay), dtype=np.int64)
        for c, step in steps.items():
            step = step + sync_seconds  # inf (does not fit) stays inf
            better = step < best_step
            best_step[better], best_combo[better] = step[better], c
        for n in np.unique(nodes):
            rows = np.flatnonzero(nodes == n)
            i = int(rows[np.argmin(best_step[rows])])
            if not np.isfinite(best_step[i]):
                continue
            zero, recompute = combos[best_combo[i]]
            layout = (int(dp[i]), int(tp[i]), int(pp[i]), zero, int(ep[i]))
            switch = once(cm, ("colocate switch", pool.gpu, workload.model, workload.lora_rank, layout),
                          functools.partial(_switch_seconds, cm, pool.gpu, workload, layout))
            out.append(TrainerOption(pool.index, int(n), int(dp[i]), int(tp[i]), int(pp[i]), zero, recompute,
                                     float(best_step[i]), batch / float(best_step[i]),
                                     int(n) * pool.per_node * pool.gpu.price_per_gpu_hour, switch, int(ep[i])))
    return out


def _switch_seconds(cm: CostModel, gpu: GpuType, workload: Workload, layout: tuple[int, int, int, int, int]) -> float:
    """One colocated hand-over of a trainer of (dp, tp, pp, ZeRO stage, ep) to TP-1 engines."""
    dp, tp, pp, zero, ep = layout
    return float(cm.colocate_switch(gpu, workload.model, 1, dp, tp, pp, zero_stage=zero, ep=ep,
                                    lora_rank=workload.lora_rank).seconds)


def _layout_steps(cm: CostModel, pool: Pool, count: int, workload: Workload, combos: list[tuple[int, str]]
                  ) -> tuple[np.ndarray, dict[int, np.ndarray]]:
    """Every layout of the pool's node counts up to `count` ((nodes, dp, tp, pp, ep) rows), and per
    (ZeRO stage, recompute) that fits any, each layout's logprob + train seconds (inf where it does
    not fit), priced in one vectorised call; read-only (shared through planner.memo)."""
    tokens = workload.samples_per_step * workload.mean_tokens_per_sample
    tps = [tp for tp in _divisors(pool.per_node) if tp_shards(workload.model, tp) is None]
    lay = _layouts(count, pool.per_node, workload.model, tps)
    dp, tp, pp, ep = lay[:, 1], lay[:, 2], lay[:, 3], lay[:, 4]
    steps: dict[int, np.ndarray] = {}
    for c, (zero, recompute) in enumerate(combos):
        fits = trainer_fits(cm, pool.gpu, workload, dp, tp, pp, zero_stage=zero, recompute=recompute, ep=ep)
        if not fits.any():
            continue
        logprob, train = trainer_step_seconds(
            cm, pool.gpu, workload, dp, tp, pp, tokens, zero_stage=zero, recompute=recompute,
            gpus_per_node=pool.per_node, inter_node_bytes_per_s=pool.inter_node_bytes_per_s, ep=ep)
        steps[c] = np.where(fits, logprob + train, np.inf)
        steps[c].flags.writeable = False
    lay.flags.writeable = False
    return lay, steps


def candidates(cm: CostModel, cluster: Cluster, workload: Workload, *, staleness: float | None = None,
               max_trainer_nodes: int | None = None, min_link_bytes_per_s: float = 0.0) -> Candidates:
    """Every option worth considering; `staleness` defaults to the workload's; only nodes whose
    network reaches `min_link_bytes_per_s` take part."""
    pools = pools_of(cluster)
    if min_link_bytes_per_s > 0:
        kept = [p for p in pools if p.inter_node_bytes_per_s >= min_link_bytes_per_s]
        pools = tuple(dataclasses.replace(p, index=i) for i, p in enumerate(kept))
    sync = estimated_sync_seconds(cm, pools, workload)
    engines = engine_options(cm, pools, workload, sync)
    trainers = trainer_options(cm, pools, workload, sync, max_trainer_nodes)
    eta = workload.staleness if staleness is None else staleness
    cohort = admission_cap(eta, 0, workload.samples_per_step)
    if workload.agentic is None:
        ratio = workload.response_len.expected() / expected_longest(workload.response_len, cohort)
    else:  # a cohort waits for its episode longest in wall time: decode plus tool waits
        ratio = agentic_rate.mean_over_max_latency(workload, cohort, _tail_seconds_per_token(cm, pools, workload,
                                                                                             engines))
    dapo = workload.dynamic_sampling
    return Candidates(pools, tuple(engines), tuple(trainers), workload.samples_per_step, eta, sync, ratio,
                      workload.interruptible and workload.mode == "async", workload.generated_per_trained,
                      1.0 if dapo is None else dapo.oversample)


def _tail_seconds_per_token(cm: CostModel, pools: tuple[Pool, ...], workload: Workload,
                            engines: list[EngineOption]) -> float:
    """Wall seconds per decoded token below its knee (planner.agentic_rate) of the engine option with the
    most samples/s per dollar: the one a plan fills first where the fleet allows."""
    if not engines:
        return 0.0
    e = max(engines, key=lambda o: o.samples_per_s / o.price_per_hour)
    return agentic_rate.tail_seconds_per_token(cm, pools[e.pool].gpu, workload, e.tp, e.batch, e.ep)


def estimated_sync_seconds(cm: CostModel, pools: tuple[Pool, ...], workload: Workload) -> float:
    """Weight push before placement: the slowest network path, to as many engines as could exist.

    Placement re-prices it on the real links (planner.placement)."""
    most = sum(p.gpus for p in pools)
    slowest = min(p.inter_node_bytes_per_s for p in pools)
    gpu = max((p.gpu for p in pools), key=lambda g: g.bf16_tflops)
    return float(cm.sync(gpu, workload.model, most, slowest, workload.lora_rank).seconds)

