"""The simulator: fast path vs token-level reference, invariants, closed form, determinism."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim import simulate
from sim.decode_tables import DecodeTable
from traces import Cluster, CostModel, Plan, RolloutGroup, SpecError, TrainerGroup, example_cluster, get_model
from traces.lengths import LengthDist
from traces.workload import Workload

CM = CostModel.roofline_only()
CLUSTER = example_cluster("mixed-h800-h20-l40s")
FIXED = LengthDist(kind="fixed", value=600)
LONGTAIL = LengthDist(kind="lognormal", mean=800, sigma=1.0, cap=4096)


def _workload(resp: LengthDist, mode: str = "async", eta: int = 2, interruptible: bool = True, prompts: int = 16,
              group: int = 8, model: str = "qwen2.5-1.5b") -> Workload:
    return Workload(model=get_model(model), prompts_per_step=prompts, group_size=group,
                    prompt_len=LengthDist(kind="uniform", low=64, high=256), response_len=resp, mode=mode,
                    staleness=eta if mode == "async" else 0, interruptible=interruptible, reward_seconds=0.01)


def _plan(mode: str = "async", eta: int = 2, engines: int = 4, trainer: str = "H800", gen: str = "H20") -> Plan:
    if mode == "colocated":
        return Plan(mode=mode, rollout=(RolloutGroup(gpu_type=trainer, tp=1, instances=8),),
                    trainer=TrainerGroup(gpu_type=trainer, dp=8))
    return Plan(mode=mode, staleness=eta if mode == "async" else 0,
                rollout=(RolloutGroup(gpu_type=gen, tp=1, instances=engines),),
                trainer=TrainerGroup(gpu_type=trainer, dp=8))


SCENARIOS = {
    "async-fixed": (FIXED, "async", True),
    "async-longtail": (LONGTAIL, "async", True),
    "async-longtail-noninterruptible": (LONGTAIL, "async", False),
    "sync-fixed": (FIXED, "sync", False),
    "sync-longtail": (LONGTAIL, "sync", False),
    "colocated-fixed": (FIXED, "colocated", False),
    "colocated-longtail": (LONGTAIL, "colocated", False),
}


@pytest.mark.parametrize("name", SCENARIOS)
def test_fast_path_matches_token_level(name: str) -> None:
    resp, mode, interruptible = SCENARIOS[name]
    w, p = _workload(resp, mode, interruptible=interruptible), _plan(mode)
    fast = simulate(CLUSTER, w, p, CM, steps=5, seed=3)
    ref = simulate(CLUSTER, w, p, CM, steps=5, seed=3, token_level=True)
    assert fast.samples_per_s == pytest.approx(ref.samples_per_s, rel=0.01)
    assert fast.mean_step_s == pytest.approx(ref.mean_step_s, rel=0.01)
    assert fast.events * 5 < ref.events  # events grow with samples, not tokens


def test_same_seed_same_result_and_seed_matters() -> None:
    w, p = _workload(LONGTAIL), _plan()
    a, b = simulate(CLUSTER, w, p, CM, steps=4, seed=7), simulate(CLUSTER, w, p, CM, steps=4, seed=7)
    assert a.summary() == b.summary()
    assert a.timeline.equals(b.timeline)
    assert simulate(CLUSTER, w, p, CM, steps=4, seed=8).summary() != a.summary()


def test_simulate_restores_the_cycle_collector() -> None:
    """A fast-path run holds Python's cyclic collector off and puts it back as it was, also when the
    run stops on bad input; and it leaves nothing of its own for the collector to keep growing."""
    import gc

    w, p = _workload(LONGTAIL), _plan()
    was = gc.isenabled()
    try:
        for enabled in (True, False):
            (gc.enable if enabled else gc.disable)()
            simulate(CLUSTER, w, p, CM, steps=2, seed=1)
            assert gc.isenabled() == enabled
            with pytest.raises(SpecError, match="samples"):
                simulate(CLUSTER, w.model_copy(update={"prompts_per_step": 1_000_000}), p, CM, steps=20)
            assert gc.isenabled() == enabled
        gc.enable()
        gc.collect()
        simulate(CLUSTER, w, p, CM, steps=2, seed=1)
        cycles_short = gc.collect()
        simulate(CLUSTER, w, p, CM, steps=8, seed=1)
        assert gc.collect() < 2 * cycles_short + 1000  # its cycles do not grow with the run's length
    finally:
        (gc.enable if was else gc.disable)()


@st.composite
def _cases(draw: st.DrawFn) -> tuple[Cluster, Workload, Plan, int]:
    gen = draw(st.sampled_from(["H20", "L40S", "A100-80G", "H100"]))
    trainer = draw(st.sampled_from(["H800", "H100", "A100-80G"]))
    nodes = {gen: draw(st.integers(1, 2))}
    nodes[trainer] = nodes.get(trainer, 0) + 1
    cluster = Cluster(node_groups=tuple({"gpu_type": t, "nodes": n} for t, n in nodes.items()))
    mode = draw(st.sampled_from(["async", "async", "sync"]))
    eta = draw(st.integers(0, 4)) if mode == "async" else 0
    resp = draw(st.sampled_from([
        LengthDist(kind="fixed", value=draw(st.integers(8, 800))),
        LengthDist(kind="uniform", low=8, high=draw(st.integers(9, 1500))),
        LengthDist(kind="lognormal", mean=300, sigma=draw(st.floats(0.2, 1.5)), cap=2000),
    ]))
    w = Workload(model=get_model("qwen2.5-1.5b"), prompts_per_step=draw(st.integers(1, 8)),
                 group_size=draw(st.integers(2, 8)), prompt_len=LengthDist(kind="uniform", low=16, high=128),
                 response_len=resp, mode=mode, staleness=eta, interruptible=draw(st.booleans()),
                 reward_seconds=draw(st.sampled_from([0.0, 0.05])))
    gen_gpus = nodes[gen] * 8 - (8 if gen == trainer else 0)
    engines = draw(st.integers(1, max(1, min(gen_gpus, 6))))
    plan = Plan(mode=mode, staleness=eta, rollout=(RolloutGroup(gpu_type=gen, tp=1, instances=engines),),
                trainer=TrainerGroup(gpu_type=trainer, dp=8))
    return cluster, w, plan, draw(st.integers(0, 2**16))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(_cases())
def test_invariants(case: tuple[Cluster, Workload, Plan, int]) -> None:
    cluster, w, plan, seed = case
    steps = 4
    r = simulate(cluster, w, plan, CM, steps=steps, seed=seed)
    # no token trained with staleness above eta
    assert r.max_staleness <= plan.staleness
    # every admitted sample is trained exactly once or still in flight
    ids = r.trained_ids
    assert len(ids) == len(set(ids)) == steps * w.samples_per_step
    assert r.trained_samples + r.in_flight == r.admitted
    # busy fractions are fractions
    assert all(0.0 <= u <= 1.0 + 1e-9 for u in r.utilization.values())
    # trained tokens add up: every token of every trained sample counted once (the lengths are
    # simulate's seeded draw: prompts first, then responses, for batch x (steps + eta + 1) samples)
    rng = np.random.default_rng(seed)
    total = w.samples_per_step * (steps + plan.staleness + 1)
    w.prompt_len.sample(rng, total)
    responses = w.response_len.sample(rng, total)
    assert sum(r.staleness_hist.values()) == int(responses[np.asarray(ids)].sum())


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
@given(_cases())
def test_one_more_engine_never_hurts_async(case: tuple[Cluster, Workload, Plan, int]) -> None:
    cluster, w, plan, seed = case
    if plan.mode != "async":
        return
    group = plan.rollout[0]
    more = plan.model_copy(update={"rollout": (group.model_copy(update={"instances": group.instances + 1}),)})
    capacity = cluster.gpu_counts[group.gpu_type] - (8 if group.gpu_type == plan.trainer.gpu_type else 0)
    if more.rollout[0].gpus > capacity:
        return
    steps = 4 * (plan.staleness + 1)  # the warm-up, then three whole periods (traces.records.recommended_steps)
    base = simulate(cluster, w, plan, CM, steps=steps, seed=seed).samples_per_s
    plus = simulate(cluster, w, more, CM, steps=steps, seed=seed).samples_per_s
    # noise: which samples land on which engine changes, and with a few samples per step one long
    # sample moves a step's time by a lot
    assert plus >= base * 0.9


def test_closed_form_async_throughput() -> None:
    """Fixed lengths, ample staleness: throughput = min(generation, training capacity) within 3%.

    Rollouts are not interruptible here, so an engine picks up new weights between waves, after they
    have long arrived: generation capacity is then one prefill plus the decode iterations per wave.
    (Interruptible rollouts pay a weight load and a KV re-prefill per step on top; see the Gantt.)
    """
    w = _workload(FIXED, "async", eta=8, interruptible=False, prompts=32, group=8).model_copy(
        update={"reward_seconds": 0.0})
    h20, h800, m = CLUSTER.gpu("H20"), CLUSTER.gpu("H800"), w.model
    for engines, dp in ((2, 8), (16, 2)):  # generation-bound, then training-bound
        trainer = TrainerGroup(gpu_type="H800", dp=dp)
        plan = _plan("async", eta=8, engines=engines).model_copy(update={"trainer": trainer})
        r = simulate(CLUSTER, w, plan, CM, steps=25, seed=0)
        # by hand: all engines fill to the same batch; one "wave" of B samples takes one prefill plus
        # 600 decode iterations whose context grows from the prompt to prompt + 600
        per_engine = min(CM.efficiency.max_num_seqs, (8 + 1) * w.samples_per_step // engines)
        prompt = w.prompt_len.expected()
        iters = sum(float(CM.decode(h20, m, 1, per_engine, prompt + j).seconds) for j in range(600))
        wave = float(CM.prefill(h20, m, 1, prompt * per_engine, prompt).seconds) + iters
        gen = engines * per_engine / wave
        tokens = w.samples_per_step * (prompt + 600)
        kw = {"seq_len": prompt + 600, "microbatch_tokens": w.max_seq_len}
        step = float(CM.logprob(h800, m, dp, 1, 1, tokens, **kw).seconds) + float(
            CM.train(h800, m, dp, 1, 1, tokens, **kw).seconds) + float(
            CM.sync(h800, m, engines, min(50e9, 25e9)).seconds)
        train = w.samples_per_step / step
        assert r.samples_per_s == pytest.approx(min(gen, train), rel=0.03), (engines, gen, train)


def test_longtail_async_beats_sync_colocated_and_gap_closes_when_fixed() -> None:
    """Same 16 H800 GPUs: async disaggregated (8 engines + 8 trainer GPUs) vs colocated sync on all 16."""
    cluster = Cluster(node_groups=({"gpu_type": "H800", "nodes": 2},))
    ratios = {}
    for name, resp in (("longtail", LengthDist(kind="lognormal", mean=1000, sigma=1.2, cap=8000)),
                       ("fixed", LengthDist(kind="fixed", value=256))):
        w_async = _workload(resp, "async", eta=2, prompts=64, group=16, model="qwen2.5-7b")
        w_sync = _workload(resp, "colocated", prompts=64, group=16, model="qwen2.5-7b")
        a = simulate(cluster, w_async, Plan(mode="async", staleness=2,
                     rollout=(RolloutGroup(gpu_type="H800", instances=8),),
                     trainer=TrainerGroup(gpu_type="H800", dp=8)),
                     CM, steps=16, seed=1)
        c = simulate(cluster, w_sync, Plan(mode="colocated", rollout=(RolloutGroup(gpu_type="H800", instances=16),),
                     trainer=TrainerGroup(gpu_type="H800", dp=16)), CM, steps=16, seed=1)
        ratios[name] = a.samples_per_s / c.samples_per_s
    print(f"async/colocated-sync throughput: long-tailed {ratios['longtail']:.2f}x, fixed {ratios['fixed']:.2f}x")
    assert ratios["longtail"] > 2.0  # AReaL reports up to 2.77x
    assert ratios["fixed"] < 1.5  # short fixed lengths: the gap nearly closes
    assert abs(ratios["fixed"] - 1) < abs(ratios["longtail"] - 1)


def test_queue_and_timeline_shapes() -> None:
    r = simulate(CLUSTER, _workload(LONGTAIL), _plan(), CM, steps=3, seed=0)
    tl = r.timeline
    assert list(tl.columns) == ["resource", "group", "activity", "start", "end", "version", "samples"]
    assert {"decode", "prefill", "train", "logprob", "sync"} <= set(tl.activity)
    assert (tl.end > tl.start).all()
    assert not r.queue.empty
    assert r.cost_per_1k_samples > 0 and np.isfinite(r.cost_per_1k_samples)


@pytest.mark.parametrize("seed", range(5))
def test_routing_a_few_samples_matches_the_water_fill(seed: int) -> None:
    """route_few (a completion frees a slot: one argmin per sample) and water_fill (a bisection on
    the key) both give the one-at-a-time heap's choice, ties to the lowest engine included."""
    from traces.routing import FEW, route_one_by_one, water_fill
    from traces.routing_kernels import route_few

    rng = np.random.default_rng(seed)
    for _ in range(200):
        engines, width = int(rng.integers(1, 12)), int(rng.integers(3, 10))
        keys = np.sort(np.round(rng.uniform(0.01, 0.05, (engines, width)), 3), axis=1)  # ties on purpose
        caps = rng.integers(1, width, engines)
        loads = np.minimum(rng.integers(0, width, engines), caps - 1)
        rows = np.arange(engines)
        accepting = rng.random(engines) < 0.8
        loads[~accepting] = caps[~accepting]  # the router only offers accepting engines with room
        keep = np.flatnonzero(accepting)
        for n in (*range(1, FEW + 1), 7, 50):  # 50: more than there are slots
            want = keep[water_fill(n, loads[keep], caps[keep], keys, rows[keep])] if len(keep) else keep
            heap = route_one_by_one(n, keep, loads[keep], caps[keep], keys[rows[keep]])
            assert want.tolist() == heap.tolist()
            if n > FEW:
                continue
            got, routed = route_few(n, accepting, loads, caps, keys, rows, 50)
            assert routed and got.tolist() == want.tolist()
        assert not route_few(FEW + 1, np.ones(engines, bool), np.zeros(engines, np.int64), np.full(engines, FEW + 1),
                             keys, rows, FEW)[1]  # more slots than `few`: the caller water-fills


def test_router_water_fills_from_the_fastest_engines() -> None:
    """Admissions spread evenly over the fastest engines, and reach slower ones only as those fill."""
    plan = Plan(mode="async", staleness=0, trainer=TrainerGroup(gpu_type="H800", dp=8),
                rollout=(RolloutGroup(gpu_type="H20", instances=4), RolloutGroup(gpu_type="L40S", instances=4)))
    shares = {}
    for prompts in (16, 96):  # 128 and 768 samples per step, 8 x 256 engine slots
        w = _workload(FIXED, eta=0, prompts=prompts, group=8, model="qwen2.5-7b")
        tl = simulate(CLUSTER, w, plan, CM, steps=1).timeline
        first = tl[(tl.activity == "prefill") & (tl.start == 0)].set_index("resource").samples
        assert first.sum() == prompts * 8
        shares[prompts] = {gpu: first[first.index.str.startswith(gpu)].tolist() for gpu in ("H20", "L40S")}
    # few samples: only H20 (4.0 TB/s) runs them, evenly; at a small batch it decodes far faster
    assert shares[16] == {"H20": [32] * 4, "L40S": []}
    # many: H20 batches grow compute-bound (148 TFLOP/s) until the L40S is as fast; both get work
    h20, l40s = shares[96]["H20"], shares[96]["L40S"]
    assert len(set(h20)) == 1 and len(l40s) == 4 and 0 < max(l40s) < h20[0]


def test_colocated_pays_the_hand_over_and_kl_reference_a_second_pass() -> None:
    colo = simulate(CLUSTER, _workload(FIXED, "colocated"), _plan("colocated"), CM, steps=2, seed=0).timeline
    switch = colo[colo.activity == "switch"]
    assert len(switch) == 4  # engines -> trainer and back, every step
    h800, m = CLUSTER.gpu("H800"), get_model("qwen2.5-1.5b")
    expected = float(CM.colocate_switch(h800, m, 1, 8, 1, 1, zero_stage=3).seconds)
    assert (switch.end - switch.start).to_numpy() == pytest.approx([expected] * 4)
    disagg = simulate(CLUSTER, _workload(FIXED), _plan(), CM, steps=2, seed=0).timeline
    assert "switch" not in set(disagg.activity)

    w = _workload(FIXED)
    lp = {kl: simulate(CLUSTER, w.model_copy(update={"kl_reference": kl}), _plan(), CM, steps=2, seed=0).timeline
          for kl in (False, True)}
    secs = {kl: (t[t.activity == "logprob"].end - t[t.activity == "logprob"].start).iloc[0] for kl, t in lp.items()}
    assert secs[True] == pytest.approx(2 * secs[False])


def test_weight_sync_uses_the_placed_nodes_links() -> None:
    """A placed plan prices sync on its own nodes' links: crossing data centres costs more."""
    cluster = Cluster(name="two-dc", node_groups=(
        {"gpu_type": "H800", "nodes": 1, "label": "dc-a"},
        {"gpu_type": "H20", "nodes": 1, "label": "dc-a"},
        {"gpu_type": "H20", "nodes": 1, "label": "dc-b"},
    ), links=({"a": "dc-a", "b": "dc-b", "gb_per_s": 1.0},))
    w = _workload(FIXED)

    def sync_seconds(engine_node: int) -> float:
        plan = Plan(mode="async", staleness=2, trainer=TrainerGroup(gpu_type="H800", dp=8, nodes=(0,)),
                    rollout=(RolloutGroup(gpu_type="H20", instances=4, nodes=(engine_node,)),))
        tl = simulate(cluster, w, plan, CM, steps=2).timeline
        return float((tl[tl.activity == "sync"].end - tl[tl.activity == "sync"].start).iloc[0])

    near, far = sync_seconds(1), sync_seconds(2)
    h800, model = cluster.gpu("H800"), get_model("qwen2.5-1.5b")
    assert near == pytest.approx(float(CM.sync(h800, model, 4, 50e9).seconds))  # the nodes' own network
    assert far == pytest.approx(float(CM.sync(h800, model, 4, 1e9).seconds))  # the dc-a <-> dc-b link
    wrong = Plan(mode="async", staleness=2, trainer=TrainerGroup(gpu_type="H800", dp=8, nodes=(1,)),
                 rollout=(RolloutGroup(gpu_type="H20", instances=4, nodes=(2,)),))
    with pytest.raises(SpecError, match="places H800 work on nodes of type H20"):
        simulate(cluster, w, wrong, CM, steps=1)


def test_preempted_samples_generate_their_whole_response() -> None:
    """KV-bound: samples are preempted and re-admitted, and still generate (and train) every token of
    their response, in both modes (a stale heap entry used to complete a re-admitted sample early)."""
    cluster = Cluster(node_groups=({"gpu_type": "H800", "nodes": 1}, {"gpu_type": "L40S", "nodes": 1}))
    w = _workload(LengthDist(kind="lognormal", mean=4000, sigma=0.6, cap=12000), "async", eta=1, prompts=8,
                  group=16, model="qwen2.5-7b")
    plan = _plan("async", eta=1, engines=1, gen="L40S")
    steps, seed = 2, 1
    rng = np.random.default_rng(seed)
    total = w.samples_per_step * (steps + plan.staleness + 1)
    w.prompt_len.sample(rng, total)
    responses = w.response_len.sample(rng, total)
    results = [simulate(cluster, w, plan, CM, steps=steps, seed=seed, token_level=t) for t in (False, True)]
    for r in results:
        assert sum(r.staleness_hist.values()) == int(responses[r.trained_ids].sum())
    fast, ref = results
    assert fast.timeline.activity.eq("decode").sum() < ref.timeline.activity.eq("decode").sum()
    assert fast.samples_per_s == pytest.approx(ref.samples_per_s, rel=0.01)


@pytest.mark.parametrize("interruptible", [True, False])
def test_parked_engines_change_nothing(monkeypatch: pytest.MonkeyPatch, interruptible: bool) -> None:
    """Engines moved through the step cycle as arrays (sim.parking) give the run the per-engine path
    gives, to the last bit, on a mixed fleet with KV preemption in play."""
    from sim.parking import Parking

    plan = Plan(mode="async", staleness=2, trainer=TrainerGroup(gpu_type="H800", dp=8),
                rollout=(RolloutGroup(gpu_type="H20", instances=4), RolloutGroup(gpu_type="L40S", instances=4)))
    w = _workload(LONGTAIL, eta=2, interruptible=interruptible, prompts=96, model="qwen2.5-7b")
    parked = simulate(CLUSTER, w, plan, CM, steps=6, seed=5)
    assert any(c[2] == "weight_load" for c in parked.recorder.fleet_chunks)  # the array path ran
    monkeypatch.setattr(Parking, "park_all", lambda self, asking, groups: asking)
    alone = simulate(CLUSTER, w, plan, CM, steps=6, seed=5)
    assert not alone.recorder.fleet_chunks
    a, b = parked.summary(), alone.summary()
    # busy time is summed per engine in another order (one bincount per array of intervals)
    assert a.pop("utilization") == pytest.approx(b.pop("utilization"), rel=1e-12)
    assert a == b
    assert parked.step_times == alone.step_times
    assert np.array_equal(parked.trained_ids, alone.trained_ids)
    assert sorted(parked.timeline_rows) == sorted(alone.timeline_rows)


def _decode_table() -> DecodeTable:
    return DecodeTable.build(CM, CLUSTER.gpu("H20"), get_model("qwen2.5-7b"), 1, 64, 60_000.0)


def _jumps(table: DecodeTable, seed: int, n: int = 3000) -> tuple[np.ndarray, ...]:
    """Random decode jumps, many spanning several grid cells, some in the last (unbounded) one."""
    rng = np.random.default_rng(seed)
    b = rng.integers(1, 65, n)
    s0 = rng.integers(0, int(table.ds * 70), n).astype(np.float64)
    k = rng.integers(0, 2000, n)
    return b, s0, k


@pytest.mark.parametrize("seed", [0, 1])
def test_decode_sums_are_the_sums_of_their_iterations(seed: int) -> None:
    """DecodeTable.totals (closed-form arithmetic series per grid cell, sim.kernels.decode_sums) equals adding
    up every iteration's time, each interpolated on the table on its own; and `total` agrees."""
    table = _decode_table()
    b, s0, k = _jumps(table, seed, n=600)
    rows = np.array(table.rows)
    last = rows.shape[1] - 2
    got = table.totals(b, s0, k)
    for i, (bb, ss, kk) in enumerate(zip(b.tolist(), s0.tolist(), k.tolist(), strict=True)):
        context = ss + bb * np.arange(kk)
        cell = np.clip((context / table.ds).astype(np.int64), 0, last)
        t = rows[bb, cell] + (rows[bb, cell + 1] - rows[bb, cell]) / table.ds * (context - cell * table.ds)
        assert got[i] == pytest.approx(t.sum(), rel=1e-9, abs=1e-12)
        assert table.total(bb, ss, kk) == got[i]


def test_prefill_curve_interpolates_log_log() -> None:
    """PrefillCurve (sim.kernels.prefill_curve): exp of np.interp on the log grid, flat beyond it."""
    from sim.decode_tables import PrefillCurve

    curve = PrefillCurve.build(CM, CLUSTER.gpu("H20"), get_model("qwen2.5-7b"), 1, 50_000.0, 300.0)
    tokens = np.concatenate(([0.0, -3.0, 0.5, 1.0], np.geomspace(1, 2e5, 500), [50_000.0]))
    want = [0.0 if t <= 0 else math.exp(np.interp(math.log(t), curve.log_tokens, curve.log_seconds))
            for t in tokens.tolist()]
    assert curve.many(tokens).tolist() == pytest.approx(want, rel=1e-14, abs=0)
    assert [curve(t) for t in tokens.tolist()] == curve.many(tokens).tolist()


def _largest_fitting(table: DecodeTable, b: int, s0: float, k: int, seconds: float) -> int:
    """The most iterations (<= k) whose sum fits in `seconds`, by bisection on the scalar sum."""
    lo, hi = 0, k
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if table.total(b, s0, mid) <= seconds + 1e-12 else (lo, mid - 1)
    return lo


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cut_solves_for_the_iteration_in_progress_as_the_bisection_does(seed: int) -> None:
    """stop_after (estimate, checked) gives what a bisection and the rule give, to the bit."""
    table = _decode_table()
    b, s0, k = _jumps(table, seed)
    rng = np.random.default_rng(seed + 10)
    whole = table.totals(b, s0, k)
    elapsed = whole * rng.uniform(0, 1.1, len(k))
    elapsed[::7] = table.totals(b[::7], s0[::7], rng.integers(0, k[::7] + 1))  # right at an iteration's end
    done, rest = table.stop_after(b, s0, k, elapsed)
    within = np.array([_largest_fitting(table, *jump) for jump in zip(b.tolist(), s0.tolist(), k.tolist(),
                                                                       elapsed.tolist(), strict=True)])
    want = np.where((within == 0) | (table.totals(b, s0, within) < elapsed - 1e-12), within + 1, within)
    want = np.minimum(k, want)
    assert done.tolist() == want.tolist()
    assert rest.tolist() == (table.totals(b, s0, want) - elapsed).tolist()


def test_stacked_tables_answer_as_each_table_does() -> None:
    """A mixed fleet's decode tables stacked (DecodeStack, rows padded to the largest batch): each
    jump's cut and the plan's clock on its own engine's table, bit for bit as that table alone."""
    from sim.decode_plans import flat_decode_plans
    from sim.decode_tables import stack_of

    small = DecodeTable.build(CM, CLUSTER.gpu("L40S"), get_model("qwen2.5-7b"), 1, 24, 30_000.0)
    big = _decode_table()
    stack, table = stack_of([big, small, big, small])
    assert table.tolist() == [0, 1, 0, 1] and stack.base.shape[:2] == (2, 65)
    rng = np.random.default_rng(4)
    b, s0, k = _jumps(small, 4, n=400)
    b = np.minimum(b, 24)
    which = rng.integers(0, 2, len(k))
    elapsed = np.where(which == 0, big.totals(b, s0, k), small.totals(b, s0, k)) * rng.uniform(0, 1, len(k))
    done, rest = stack.stop_after(which, b, s0, k, elapsed)
    for t, one in enumerate((big, small)):
        mine = which == t
        want_done, want_rest = one.stop_after(b[mine], s0[mine], k[mine], elapsed[mine])
        assert done[mine].tolist() == want_done.tolist() and rest[mine].tolist() == want_rest.tolist()
    # four engines of 12 samples, two kinds: each engine's jump ends are its own table's sums
    eng = np.repeat(np.arange(4), 12)
    fin = rng.integers(1, 400, len(eng))
    exit_tokens = rng.integers(100, 500, len(eng))
    flat = flat_decode_plans(eng, np.arange(len(eng)), fin, np.zeros(len(eng), np.int64), np.zeros(4, np.int64),
                             np.full(4, 3000.0), np.zeros(4), np.full(4, 1e9), np.zeros(4, bool), stack, table,
                             exit_tokens)
    for e, one in enumerate((big, small, big, small)):
        lo, hi = flat.jumps[e], flat.jumps[e + 1]
        clock = 0.0
        for j in range(lo, hi):
            clock = clock + one.total(int(flat.b[j]), float(flat.s[j]), int(flat.k[j]))
            assert flat.ends[j] == clock


def test_mixed_fleet_fast_path_matches_token_level() -> None:
    """Two kinds of engine (each on its own decode table) under the fast path and the token-level
    reference: the same throughput and step time."""
    plan = Plan(mode="async", staleness=2, trainer=TrainerGroup(gpu_type="H800", dp=8),
                rollout=(RolloutGroup(gpu_type="H20", instances=2), RolloutGroup(gpu_type="L40S", instances=2)))
    w = _workload(LONGTAIL, eta=2, prompts=24)
    fast = simulate(CLUSTER, w, plan, CM, steps=5, seed=2)
    ref = simulate(CLUSTER, w, plan, CM, steps=5, seed=2, token_level=True)
    assert fast.samples_per_s == pytest.approx(ref.samples_per_s, rel=0.01)
    assert fast.mean_step_s == pytest.approx(ref.mean_step_s, rel=0.01)
    assert fast.utilization.keys() == ref.utilization.keys() and len(fast.utilization) == 3


def test_pending_pool_answers_as_a_sorted_index_would() -> None:
    """Completions filed unsorted, cut and delivered: due() hands out exactly those at or before now,
    and kth_time is the n-th completion time of the live ones (by start version)."""
    from sim.completion_pool import CompletionPool

    rng = np.random.default_rng(3)
    start_version = np.zeros(1000, np.int64)
    pending, live = CompletionPool(start_version), {}  # sid -> (time, version) of what should still be in
    sid = 0
    for _ in range(30):
        n_parts = int(rng.integers(1, 6))
        sizes = rng.integers(0, 8, n_parts)
        owner = np.repeat(np.arange(n_parts), sizes)
        ranks = np.concatenate([np.arange(s) for s in sizes]) if len(owner) else owner
        times = np.round(rng.uniform(0, 50, len(owner)), 1)  # ties on purpose
        sids, versions = np.arange(sid, sid + len(owner)), rng.integers(0, 4, len(owner))
        sid += len(owner)
        start_version[sids] = versions
        first = pending.file_parts(times, sids, owner, ranks, n_parts)
        live.update({int(s): (float(t), int(v)) for s, t, v in zip(sids, times, versions, strict=True)})
        keep = rng.integers(0, 9, n_parts)  # cut some parts back
        pending.cut_parts(first + np.arange(n_parts), keep)
        for s, o, r in zip(sids.tolist(), owner.tolist(), ranks.tolist(), strict=True):
            if r >= keep[o]:
                live.pop(s)
        now = float(rng.uniform(0, 50))
        got, levels, counts = pending.due(now)
        due = sorted(s for s, (t, _) in live.items() if t <= now)
        assert sorted(got.tolist()) == due
        # grouped by start version, ascending
        assert got[np.argsort([live[s][1] for s in got.tolist()], kind="stable")].tolist() == got.tolist()
        assert dict(zip(levels.tolist(), counts.tolist(), strict=True)) == dict(
            Counter(live[s][1] for s in due)) and sorted(levels.tolist()) == levels.tolist()
        for s in due:
            live.pop(s)
        need = {int(level): int(rng.integers(1, 5)) for level in rng.integers(0, 4, 2)}
        want = -np.inf
        for level, count in need.items():
            mine = sorted(t for t, v in live.values() if v <= level)
            want = max(want, mine[count - 1] if len(mine) >= count else np.inf)
        assert pending.kth_time(need) == want
