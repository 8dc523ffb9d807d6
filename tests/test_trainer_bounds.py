"""The async MILP leaves out the trainer options that cannot win (planner.trainer_bounds, issue 19)
and answers as the whole MILP does: each option's bound holds, the answers with and without the
pruning are the same, and a floor that would cut off the answer falls back to the whole MILP."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from planner import milp, trainer_bounds
from planner.candidates import Candidates, candidates
from traces import Cluster, CostModel, Workload, get_model
from traces.lengths import LengthDist

TYPES = ("H800", "H20", "L40S", "A100-80G", "H100", "L4")


def _cand(nodes: int, model: str, interruptible: bool) -> Candidates:
    groups = tuple({"gpu_type": t, "nodes": nodes // len(TYPES) + (i < nodes % len(TYPES))}
                   for i, t in enumerate(TYPES))
    workload = Workload(name="bounds", model=get_model(model), prompts_per_step=64, group_size=16,
                        prompt_len=LengthDist(kind="lognormal", mean=400, sigma=0.5, cap=1024),
                        response_len=LengthDist(kind="lognormal", mean=2000, sigma=0.9, cap=8192),
                        staleness=4, interruptible=interruptible, ppo_minibatches=4)
    return candidates(CostModel.roofline_only(), Cluster(name="bounds", node_groups=groups), workload)


def _answers(cand: Candidates, **kw: object) -> list[tuple[object, ...]]:
    return [(s.trainer, s.engines, s.samples_per_s, s.cost_per_hour, s.lp_bound)
            for s in milp.solve_async(cand, top_k=3, **kw)]  # type: ignore[arg-type]


@pytest.mark.parametrize(("nodes", "model"), [(32, "qwen2.5-7b"), (128, "qwen2.5-32b")])
def test_each_option_alone_stays_under_its_bound(nodes: int, model: str) -> None:
    cand = _cand(nodes, model, interruptible=True)
    bounds = trainer_bounds.objective_bounds(cand)
    assert len(bounds) == len(cand.trainers) >= milp.PRUNE_FROM
    picked = np.unique(np.linspace(0, len(cand.trainers) - 1, 40).astype(int))  # small to large trainers
    for k in picked:
        alone = milp.solve_async_fixed(dataclasses.replace(cand, trainers=(cand.trainers[k],)))
        reached = alone[0].samples_per_s - trainer_bounds.TIE_BREAK * alone[0].cost_per_hour if alone else 0.0
        assert reached <= bounds[k] * (1 + 1e-6) + 1e-9, (k, reached, bounds[k])


@pytest.mark.parametrize(("nodes", "model", "interruptible"),
                         [(32, "qwen2.5-7b", True), (128, "qwen2.5-7b", False), (128, "qwen2.5-32b", True)])
def test_pruned_milp_answers_as_the_whole(monkeypatch: pytest.MonkeyPatch, nodes: int, model: str,
                                          interruptible: bool) -> None:
    cand = _cand(nodes, model, interruptible)
    solved_with: list[int] = []  # options in each solve of the whole model
    solve = milp._solve

    def counted(model: milp._Model, solver_name: str, relax: bool) -> bool:
        if len(model.y) >= milp.PRUNE_FROM and not relax:
            solved_with.append(sum(1 for v in model.y.values() if v.upBound != 0))
        return solve(model, solver_name, relax)

    monkeypatch.setattr(milp, "_solve", counted)
    pruned = _answers(cand)
    budget = 0.7 * float(pruned[0][3])  # $/h: the best plan's price no longer fits
    budgeted = _answers(cand, budget=budget)
    assert solved_with and min(solved_with) < len(cand.trainers)  # the pruning ran and left options out
    assert budgeted and float(budgeted[0][3]) <= budget
    monkeypatch.setattr(milp, "PRUNE_FROM", 10**9)
    assert pruned == _answers(cand)
    assert budgeted == _answers(cand, budget=budget)


def test_probes_that_overstate_fall_back_to_the_whole_milp(monkeypatch: pytest.MonkeyPatch) -> None:
    """The floor is only as good as the probes: one no plan reaches leaves every option out, and
    each answer is then solved again with every option (with valid bounds and probes, an answer below
    the floor cannot happen: a probe not yet cut off is a feasible plan)."""
    cand = _cand(128, "qwen2.5-7b", interruptible=True)
    whole = _answers(cand)
    probe = milp._Ranking._probe
    claimed: list[bool] = []

    def too_high(self: milp._Ranking) -> tuple[np.ndarray, dict[int, float]]:
        bounds, probed = probe(self)
        claimed.append(True)
        return bounds, {k: 2 * v for k, v in probed.items()}

    monkeypatch.setattr(milp._Ranking, "_probe", too_high)
    assert claimed == [] and _answers(cand) == whole and claimed
