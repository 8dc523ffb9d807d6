"""The per-completion shortcuts of a busy small fleet (issue 19 point 1) answer as the general paths do:
a lone engine's cut, one routed sample's admission, one-part and one-entry filings of the completion pool."""

from __future__ import annotations

from collections import Counter, deque

import numpy as np
import pytest

from sim.admission import decide_admission
from sim.completion_pool import CompletionPool
from sim.decode_plans import Batch, DecodeRequest, cut_one, cuts_of, decode_plans_of, first_jump_plan
from sim.decode_tables import DecodeTable
from sim.samples import Samples
from traces import CostModel, example_cluster, get_model
from traces.capacity import fits_kv, kv_room


def _table() -> DecodeTable:
    cluster = example_cluster("mixed-h800-h20-l40s")
    return DecodeTable.build(CostModel.roofline_only(), cluster.gpu("H20"), get_model("qwen2.5-7b"), 1, 64, 60_000.0)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_lone_cut_is_the_cut_of_many(seed: int) -> None:
    """cut_one (stop_one on plain numbers) gives cuts_of's jumps, iterations and seconds left, bit for bit,
    for first jumps and for plans of many jumps, at their start, inside a jump and at a jump's end."""
    table, rng = _table(), np.random.default_rng(seed)
    exit_tokens = rng.integers(100, 3000, 500)
    for _ in range(40):
        b = int(rng.integers(1, 40))
        sid = rng.choice(500, b, replace=False).astype(np.int64)
        finish = rng.integers(5, 400, b).astype(np.int64)
        request = DecodeRequest(Batch(sid, finish, np.zeros(b, np.int64)), 3, float(rng.integers(0, 40_000)),
                                float(rng.uniform(0, 100)), 1e7, table, bool(rng.integers(0, 2)))
        plans = [first_jump_plan(request, exit_tokens), *decode_plans_of([request], exit_tokens)]
        for plan in plans:
            ends = plan.ends.tolist()
            for now in [plan.t0, *ends[:-1], *rng.uniform(plan.t0, ends[-1], 5).tolist()]:
                if now >= ends[-1]:
                    continue
                assert cut_one(plan, table, now) == cuts_of([(plan, table)], now)[0]


def _samples(rng: np.random.Generator, n: int) -> Samples:
    return Samples(rng.integers(10, 3000, n), rng.integers(1, 3000, n))


@pytest.mark.parametrize("seed", [0, 1])
def test_one_routed_sample_is_admitted_by_the_rule(seed: int) -> None:
    """One routed sample, nothing waiting, a free slot: it joins if it fits the KV room with a token to
    spare (or the engine is empty), else it waits first in line; the inbox is left empty either way."""
    rng = np.random.default_rng(seed)
    s = _samples(rng, 200)
    seen: Counter[bool] = Counter()
    for _ in range(300):
        sid = int(rng.integers(0, 200))
        running, kv = int(rng.integers(0, 4)), float(rng.integers(2_000, 12_000))
        context = float(rng.integers(0, int(kv))) if running else 0.0
        if running and rng.uniform() < 0.3:  # at the edge: the last token to spare, or one short of it
            context = float(np.floor(kv_room(kv))) - int(s.prompt[sid]) - 1 + int(rng.integers(0, 2))
        a = decide_admission(s, deque(), np.array([sid]), running, 8, context, kv)
        joins = running == 0 or bool(fits_kv(context, int(s.prompt[sid]), kv_room(kv)))
        seen[joins] += 1
        assert a.sids.tolist() == ([sid] if joins else []) and list(a.waiting) == ([] if joins else [sid])
        assert len(a.inbox) == 0 and a.seen == 1 and a.fresh
    assert seen[True] and seen[False]  # both outcomes were tried


def test_one_part_filings_answer_as_a_sorted_index_would() -> None:
    """Completions filed one engine at a time (often one entry: the shortcut), cut, delivered and timed in
    any order (kth_time between filings, when nothing was cut or delivered since the last compaction)."""
    rng = np.random.default_rng(5)
    start_version = np.zeros(3000, np.int64)
    pool, live = CompletionPool(start_version), {}  # sid -> (time, version) still to come
    sid = 0
    for _ in range(400):
        n = int(rng.choice([0, 1, 1, 1, 2, 3]))
        times = np.round(rng.uniform(0, 60, n), 1)  # ties on purpose
        sids = np.arange(sid, sid + n)
        sid += n
        start_version[sids] = rng.integers(0, 4, n)
        part = pool.file(times, sids)
        live.update({int(x): (float(t), int(start_version[x])) for x, t in zip(sids, times, strict=True)})
        if n and rng.uniform() < 0.4:
            keep = int(rng.integers(0, n))
            pool.cut(part, keep)
            for x in sids[keep:].tolist():
                live.pop(x)
        if rng.uniform() < 0.3:
            now = float(rng.uniform(0, 60))
            got, _, _ = pool.due(now)
            due = sorted(x for x, (t, _) in live.items() if t <= now)
            assert sorted(got.tolist()) == due
            for x in due:
                live.pop(x)
        need = {int(level): int(rng.integers(1, 4)) for level in rng.integers(0, 4, int(rng.integers(0, 3)))}
        if need:
            want = -np.inf
            for level, count in need.items():
                mine = sorted(t for t, v in live.values() if v <= level)
                want = max(want, mine[count - 1] if len(mine) >= count else np.inf)
        else:
            want = min((t for t, _ in live.values()), default=np.inf)
        assert pool.kth_time(need) == want


def test_engine_tables_kept_between_runs_give_the_runs_built_afresh() -> None:
    """sim.simulate keeps each kind of engine's tables between runs of one cost model: a run that finds
    them gives, bit for bit, the run that built them; another cost model object builds its own."""
    import importlib

    simulate_module = importlib.import_module("sim.simulate")  # the module: sim.simulate names the function too
    from sim import simulate
    from traces import Plan, example_workload
    from traces.plan import RolloutGroup, TrainerGroup

    cluster = example_cluster("mixed-h800-h20-l40s")
    workload = example_workload("qwen2.5-1.5b-math-short")
    plan = Plan(mode="async", staleness=workload.staleness,
                rollout=(RolloutGroup(gpu_type="H20", tp=1, instances=8, nodes=(8,)),),
                trainer=TrainerGroup(gpu_type="H800", dp=8, nodes=(0,)))
    cm = CostModel.roofline_only()
    simulate_module._KINDS.clear()
    built = simulate(cluster, workload, plan, cm, steps=3, seed=1)
    assert len(simulate_module._KINDS) == 1
    found = simulate(cluster, workload, plan, cm, steps=3, seed=1)
    assert len(simulate_module._KINDS) == 1  # found, not built again
    assert (built.step_times, built.trained_ids.tobytes(), built.events) == \
        (found.step_times, found.trained_ids.tobytes(), found.events)
    other = CostModel.roofline_only()
    simulate(cluster, workload, plan, other, steps=1, seed=1)
    assert len(simulate_module._KINDS) == 2  # keyed by the cost model too
