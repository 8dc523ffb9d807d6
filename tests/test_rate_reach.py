"""planner.rate_reach.reaches answers what the full rate computation answers, bit for bit, so
planner.fixed_point.settled (which asks it at each step of its bisection) returns the plans it returned
when each step computed the whole rate (issue 19)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from planner import fixed_point
from planner.candidates import candidates
from planner.fixed_point import settled
from planner.milp import solve_async
from planner.rate_model import evaluate
from planner.rate_reach import reaches
from traces import Cluster, CostModel, Workload, get_model
from traces.lengths import LengthDist

CM = CostModel.roofline_only()


def _cand(interruptible: bool, gpus: tuple[tuple[str, int], ...]):  # type: ignore[no-untyped-def]
    cluster = Cluster(name="reach", node_groups=tuple({"gpu_type": g, "nodes": n} for g, n in gpus))
    workload = Workload(name="reach", model=get_model("qwen2.5-1.5b"), prompts_per_step=32, group_size=8,
                        prompt_len=LengthDist(kind="uniform", low=64, high=512),
                        response_len=LengthDist(kind="lognormal", mean=1200, sigma=0.9, cap=4096),
                        staleness=2, interruptible=interruptible)
    return candidates(CM, cluster, workload)


FLEETS = [(True, (("H800", 2), ("H20", 1))), (False, (("H800", 1), ("L40S", 2))),
          (True, (("A100-80G", 1), ("L4", 2), ("H20", 1)))]


def _full_rate_reaches(cand, trainer, engines, z):  # type: ignore[no-untyped-def]
    """What planner.fixed_point.settled asked at each step before reaches: the whole rate, compared with z."""
    return evaluate(cand, trainer, engines, "async")[0] >= z


@pytest.mark.parametrize(("interruptible", "gpus"), FLEETS)
def test_reaches_is_the_full_rate_compared_with_z(interruptible: bool, gpus: tuple[tuple[str, int], ...]) -> None:
    cand = _cand(interruptible, gpus)
    rng = np.random.default_rng(7)
    checked = 0
    for _ in range(60):
        trainer = cand.trainers[int(rng.integers(len(cand.trainers)))]
        picks = rng.choice(len(cand.engines), size=min(3, len(cand.engines)), replace=False)
        period = float(rng.choice([math.inf, rng.uniform(5, 200)]))
        engines = tuple((cand.engines[int(r)].derated(period), int(rng.integers(0, 5))) for r in picks)
        rate = evaluate(cand, trainer, engines, "async")[0]
        zs = [rate, np.nextafter(rate, math.inf), np.nextafter(rate, -math.inf), rate * (1 + 1e-10),
              rate * (1 - 1e-10), 0.0, trainer.samples_per_s, np.nextafter(trainer.samples_per_s, math.inf),
              *rng.uniform(0, 1.2 * trainer.samples_per_s, 6)]
        for z in zs:
            assert reaches(cand, trainer, engines, float(z)) == (rate >= z), (rate, z)
            checked += 1
    assert checked == 60 * 14


@pytest.mark.parametrize(("interruptible", "gpus"), FLEETS)
def test_settled_returns_what_the_full_bisection_returned(interruptible: bool, gpus: tuple[tuple[str, int], ...],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    cand = _cand(interruptible, gpus)
    found = solve_async(cand, top_k=3) + solve_async(cand, "cost", target=1.0, top_k=2)
    assert found
    base = {(o.pool, o.tp, o.ep): o for o in cand.engines}
    for sol in found:
        engines = tuple((base[o.pool, o.tp, o.ep], n) for o, n in sol.engines)
        fast = settled(cand, sol, engines)
        with monkeypatch.context() as m:
            m.setattr(fixed_point, "reaches", _full_rate_reaches)
            assert fast == settled(cand, sol, engines)
