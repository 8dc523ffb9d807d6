"""Recompute preemption in one pass (sim.kernels.preemption) takes the victims, in the order, and with the
state updates that the engine's old loop (one lexsort of the batch per victim) took."""

from __future__ import annotations

from collections import Counter, deque
from typing import Any

import numpy as np
import pytest

import sim.engine
from sim import simulate
from sim.admission import EMPTY
from sim.decode_plans import Batch
from sim.engine import Engine
from sim.kernels.preemption import preempt
from sim.samples import Samples
from traces import Cluster, CostModel, Plan, RolloutGroup, TrainerGroup, get_model
from traces.lengths import LengthDist
from traces.workload import Workload


class _State:
    """What the old loop read and wrote of an engine."""

    def __init__(self, batch: Batch, progress: int, context: float, kv_tokens: float, version: int,
                 samples: Samples, waiting: deque[int]) -> None:
        self.batch, self.progress, self.context, self.kv_tokens = batch, progress, context, kv_tokens
        self.version, self.samples, self.waiting = version, samples, waiting


def reference_preempt(self: Any) -> None:
    """Engine._preempt as it was (commit a3774f7): one victim at a time."""
    s = self.samples
    while self.context > self.kv_tokens and len(self.batch) > 1:
        i = int(np.lexsort((self.batch.sid, self.batch.joined))[-1])  # newest joined, then highest id
        sid, joined = int(self.batch.sid[i]), int(self.batch.joined[i])
        self.batch = self.batch.without(np.arange(len(self.batch)) != i)
        tokens = self.progress - joined
        s.credit(np.array([sid]), self.version, np.array([tokens]))
        s.generated[sid] += tokens
        self.context -= int(s.prompt[sid] + s.generated[sid])
        if s.cached is not None:
            s.cached[sid] = 0
        self.waiting.appendleft(sid)


def _credits(s: Samples) -> Counter[tuple[int, int, int]]:
    """Every (sample, version, tokens) credited, as a multiset (credits are tallied as sums)."""
    out: Counter[tuple[int, int, int]] = Counter()
    for sids, version, tokens in zip(s._credit_sids, s._credit_versions, s._credit_tokens, strict=True):
        versions = np.broadcast_to(np.asarray(version), sids.shape)
        out.update(zip(sids.tolist(), versions.tolist(), tokens.tolist(), strict=True))
    return out


def _random_case(rng: np.random.Generator, episodes: bool) -> tuple[_State, _State]:
    """Two identical engine states: a random batch (joined drawn from few values: many ties), its
    samples' prompts, earlier tokens and prefix caches, and a KV limit from no overflow to all but one leaving."""
    n_samples, b = 400, int(rng.integers(1, 60))
    prompts, responses = rng.integers(10, 2000, n_samples), rng.integers(10, 3000, n_samples)
    progress = int(rng.integers(50, 5000))
    sid = rng.choice(n_samples, b, replace=False).astype(np.int64)
    joined = rng.choice(rng.integers(0, progress, 4), b).astype(np.int64)  # four distinct join points
    finish = joined + rng.integers(1, 3000, b)
    generated = rng.integers(0, 500, n_samples)
    held = prompts[sid] + generated[sid] + (progress - joined)
    context = float(held.sum()) + float(rng.uniform(-0.5, 0.5))  # a fraction: floats, not integers, are compared
    kv = float(rng.choice([context + 1, context - 1, context * rng.uniform(0.05, 1.0), 0.0]))
    states = []
    for _ in range(2):
        s = Samples(prompts, responses, episodes=episodes)
        s.generated[:] = generated
        if s.cached is not None:
            s.cached[:] = rng.integers(0, 100, n_samples) if not states else states[0].samples.cached
        states.append(_State(Batch(sid.copy(), finish.copy(), joined.copy()), progress, context, kv,
                             int(rng.integers(0, 5)) if not states else states[0].version, s,
                             deque(rng.integers(0, n_samples, 3).tolist()) if not states else
                             deque(states[0].waiting)))
    return states[0], states[1]


@pytest.mark.parametrize("episodes", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_the_kernel_takes_the_loops_victims(seed: int, episodes: bool) -> None:
    """On random batches with ties in `joined`: the same batch left (rows and their order), context to
    the bit, waiting line, tokens credited, generated counts and prefix caches."""
    rng = np.random.default_rng(seed)
    took = Counter[str]()
    for _ in range(200):
        old, new = _random_case(rng, episodes)
        n0 = len(old.batch)
        reference_preempt(old)
        Engine._preempt(new)  # type: ignore[arg-type]
        gone = n0 - len(old.batch)
        took["none" if not gone else "one" if gone == 1 else "many"] += 1
        for field in ("sid", "finish", "joined"):
            assert np.array_equal(getattr(old.batch, field), getattr(new.batch, field))
            assert getattr(new.batch, field).dtype == np.int64
        assert new.context == old.context and type(new.context) is float
        assert list(new.waiting) == list(old.waiting)
        assert all(type(x) is int for x in new.waiting)
        assert _credits(new.samples) == _credits(old.samples)
        assert np.array_equal(new.samples.generated, old.samples.generated)
        if episodes:
            assert new.samples.cached is not None and old.samples.cached is not None
            assert np.array_equal(new.samples.cached, old.samples.cached)
    assert min(took["none"], took["one"], took["many"]) > 10, took  # each case was tried, often


def test_the_kernel_on_its_own() -> None:
    """A hand-made batch: the newest join leaves first, ties by the highest id; one sample always stays."""
    prompt = np.array([10, 20, 30, 40, 50], np.int64)
    generated = np.zeros(5, np.int64)
    sid = np.array([0, 3, 1, 4, 2], np.int64)
    joined = np.array([5, 8, 8, 2, 8], np.int64)
    held = prompt[sid] + (10 - joined)  # its KV now: prompt + tokens since it joined
    keep, victims, tokens, context = preempt(sid, joined, 10, float(held.sum()), 0.0, prompt, generated, EMPTY,
                                             False)
    assert victims.tolist() == [3, 2, 1, 0] and tokens.tolist() == [2, 2, 2, 5]
    assert keep.tolist() == [False, False, False, True, False]  # sample 4 (joined first) stays
    assert context == float(held[keep].sum())
    assert generated.tolist() == [5, 2, 2, 2, 0]


def _kv_bound() -> tuple[Cluster, Workload, Plan]:
    """bench/sim_compare.py's KV-heavy case, shorter: 7b on two L40S engines, long responses."""
    cluster = Cluster(node_groups=({"gpu_type": "H800", "nodes": 1}, {"gpu_type": "L40S", "nodes": 1}))
    w = Workload(model=get_model("qwen2.5-7b"), prompts_per_step=64, group_size=16,
                 prompt_len=LengthDist(kind="uniform", low=64, high=256),
                 response_len=LengthDist(kind="lognormal", mean=3000, sigma=0.8, cap=16384), mode="async",
                 staleness=2, interruptible=True, reward_seconds=0.05)
    plan = Plan(mode="async", staleness=2, rollout=(RolloutGroup(gpu_type="L40S", tp=1, instances=2),),
                trainer=TrainerGroup(gpu_type="H800", dp=8))
    return cluster, w, plan


@pytest.mark.parametrize("interruptible", [True, False])
def test_a_kv_bound_run_is_the_old_loops_run(monkeypatch: pytest.MonkeyPatch, interruptible: bool) -> None:
    """A simulation that preempts thousands of samples, many at once, gives with the kernel the run the
    old loop gives (patched in), to the bit."""
    cluster, w, plan = _kv_bound()
    w = w.model_copy(update={"interruptible": interruptible})
    seen = Counter[int]()

    def counted(*args: Any) -> tuple[np.ndarray, ...]:
        out = preempt(*args)
        seen[len(out[1])] += 1
        return out

    monkeypatch.setattr(sim.engine, "preempt", counted)
    new = simulate(cluster, w, plan, CostModel.roofline_only(), steps=2, seed=0)
    assert sum(k * v for k, v in seen.items()) > 1000 and max(seen) > 10, seen  # preemption happened, in bulk
    monkeypatch.setattr(Engine, "_preempt", reference_preempt)
    old = simulate(cluster, w, plan, CostModel.roofline_only(), steps=2, seed=0)
    assert new.summary() == old.summary()
    assert new.step_times == old.step_times
    assert new.staleness_hist == old.staleness_hist
    assert np.array_equal(new.trained_ids, old.trained_ids)
    assert sorted(new.timeline_rows) == sorted(old.timeline_rows)
    assert new.queue_rows == old.queue_rows
