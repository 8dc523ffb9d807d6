"""The planner: MILP optimality against brute force, placement, explanations, exports, the CLI."""

from __future__ import annotations

import itertools
import random

import pytest

from planner.api import plan_report
from planner.candidates import Candidates, EngineOption, candidates
from planner.explain import NoPlan
from planner.frameworks import launches
from planner.milp import evaluate, solve_async_fixed, solve_colocated, solve_sync
from planner.sweeps import Change, pareto, what_if
from traces import Cluster, CostModel, Plan, SpecError, Workload, example_cluster, get_model
from traces.lengths import LengthDist

CM = CostModel.roofline_only()
TYPES = ["H100", "H800", "H20", "A100-80G", "L40S", "A10G"]


def _workload(model: str = "qwen2.5-1.5b", eta: int = 2, mode: str = "async", prompts: int = 16, group: int = 8,
              response: LengthDist | None = None, prompt: LengthDist | None = None, **kw: object) -> Workload:
    return Workload(model=get_model(model), prompts_per_step=prompts, group_size=group,
                    prompt_len=prompt or LengthDist(kind="uniform", low=64, high=256),
                    response_len=response or LengthDist(kind="lognormal", mean=600, sigma=0.8, cap=2048),
                    mode=mode, staleness=eta if mode == "async" else 0, interruptible=False, **kw)


# ---- brute force ---------------------------------------------------------------------------------
def _pool_vectors(options: list[EngineOption], capacity: int) -> list[tuple[tuple[EngineOption, int], ...]]:
    """Every multiset of engines of these options that fits `capacity` GPUs."""
    out: list[tuple[tuple[EngineOption, int], ...]] = [()]
    for option in options:
        out = [(*v, (option, n)) for v in out
               for n in range(0, (capacity - sum(o.tp * k for o, k in v)) // option.tp + 1)]
    return [tuple((o, n) for o, n in v if n) for v in out]


def _brute_force(cand: Candidates, mode: str, budget: float | None) -> float:
    best = 0.0
    for t in cand.trainers:
        per_pool = []
        for p in cand.pools:
            cap = p.gpus - (t.nodes * p.per_node if t.pool == p.index else 0)
            per_pool.append(_pool_vectors([o for o in cand.engines if o.pool == p.index], cap))
        for combo in itertools.product(*per_pool):
            engines = tuple(e for part in combo for e in part)
            if not engines:
                continue
            rate, *_, cost = evaluate(cand, t, engines, mode)
            if budget is None or cost <= budget + 1e-9:
                best = max(best, rate)
    return best


def _random_instance(rng: random.Random) -> tuple[Cluster, Workload, float | None]:
    types = rng.sample(TYPES, rng.choice([2, 3]))
    groups, left = [], 32
    for t in types:
        per_node = rng.choice([2, 4])
        nodes = rng.randint(1, max(1, min(3, left // per_node // 2)))
        left -= per_node * nodes
        groups.append({"gpu_type": t, "nodes": nodes, "gpus_per_node": per_node})
    cluster = Cluster(node_groups=tuple(groups))
    workload = _workload(eta=rng.randint(0, 4), prompts=rng.choice([4, 16, 64]), group=rng.choice([4, 8]),
                         response=LengthDist(kind="lognormal", mean=rng.choice([200, 600, 1500]), sigma=0.8,
                                             cap=4096))
    budget = rng.choice([None, None, 40.0, 80.0])
    return cluster, workload, budget


@pytest.mark.parametrize("seed", range(20))
def test_async_milp_matches_brute_force(seed: int) -> None:
    """20 random small fleets (2-3 GPU types, <= 32 GPUs): the MILP's optimum is the enumerated one."""
    cluster, workload, budget = _random_instance(random.Random(seed))
    assert cluster.total_gpus <= 32
    cand = candidates(CM, cluster, workload)
    found = solve_async_fixed(cand, budget=budget)
    brute = _brute_force(cand, "async", budget)
    milp = found[0].samples_per_s if found else 0.0
    assert milp == pytest.approx(brute, rel=1e-6, abs=1e-9), (seed, cluster, budget)
    if found:
        assert found[0].gap <= 1e-6
        assert found[0].lp_bound >= milp * (1 - 1e-9)  # the relaxation bounds the optimum


@pytest.mark.parametrize("seed", range(8))
def test_async_milp_with_the_interruptible_tail_window_matches_brute_force(seed: int) -> None:
    """Interruptible engines: the tail's in-flight cap falls with z (one big-M row per trainer); the
    MILP's optimum is still the enumerated one (milp.evaluate's bisection)."""
    cluster, workload, budget = _random_instance(random.Random(200 + seed))
    cand = candidates(CM, cluster, workload.model_copy(update={"interruptible": True, "staleness": 1 + seed % 3}))
    assert cand.interruptible
    found = solve_async_fixed(cand, budget=budget)
    assert (found[0].samples_per_s if found else 0.0) == pytest.approx(_brute_force(cand, "async", budget),
                                                                       rel=1e-6, abs=1e-9), (seed, cluster)


@pytest.mark.parametrize("seed", range(6))
def test_sync_enumeration_matches_brute_force(seed: int) -> None:
    cluster, workload, budget = _random_instance(random.Random(100 + seed))
    cand = candidates(CM, cluster, workload.model_copy(update={"mode": "sync", "staleness": 0}))
    found = solve_sync(cand, budget=budget)
    assert (found[0].samples_per_s if found else 0.0) == pytest.approx(_brute_force(cand, "sync", budget),
                                                                       rel=1e-6, abs=1e-9)


def test_cost_objective_is_the_cheapest_plan_reaching_the_target() -> None:
    cluster, workload, _ = _random_instance(random.Random(7))
    cand = candidates(CM, cluster, workload)
    top = solve_async_fixed(cand)[0].samples_per_s
    cheap = solve_async_fixed(cand, "cost", target=0.5 * top)[0]
    assert cheap.samples_per_s >= 0.5 * top * (1 - 1e-6)
    assert cheap.cost_per_hour <= solve_async_fixed(cand)[0].cost_per_hour
    # nothing cheaper reaches the target: every plan within a smaller budget falls short
    below = solve_async_fixed(cand, budget=cheap.cost_per_hour * 0.999)
    assert not below or below[0].samples_per_s < 0.5 * top


def test_top_k_solutions_are_distinct_and_ranked() -> None:
    cand = candidates(CM, example_cluster("mixed-h800-h20-l40s"), _workload("qwen2.5-7b", prompts=64, group=16))
    sols = solve_async_fixed(cand, top_k=4)
    assert len(sols) == 4
    assert len({(s.trainer.pool, s.trainer.nodes) for s in sols}) == 4
    rates = [s.samples_per_s for s in sols]
    assert rates == sorted(rates, reverse=True)


def test_colocated_enumeration_uses_one_pool_for_both() -> None:
    cand = candidates(CM, example_cluster("mixed-h800-h20-l40s"), _workload("qwen2.5-7b", mode="colocated"))
    best = solve_colocated(cand)[0]
    (option, engines), = best.engines
    assert option.pool == best.trainer.pool
    assert option.tp * engines == best.trainer.nodes * cand.pools[best.trainer.pool].per_node


# ---- where work goes ------------------------------------------------------------------------------
def _h800_h20() -> Cluster:
    return Cluster(name="h800-h20", node_groups=({"gpu_type": "H800", "nodes": 2}, {"gpu_type": "H20", "nodes": 2}))


def _fleet() -> Cluster:
    return Cluster(name="h800-h20", node_groups=({"gpu_type": "H800", "nodes": 4}, {"gpu_type": "H20", "nodes": 8}))


def test_decode_heavy_generation_goes_to_h20_training_to_h800() -> None:
    """Long responses, many in flight: small decode batches are memory-bound and the H20 has the faster
    HBM (4.0 vs 3.35 TB/s); training is compute-bound and the H800 has 6.7x the FLOPs."""
    w = _workload("qwen2.5-7b", eta=4, prompts=64, group=16, prompt=LengthDist(kind="fixed", value=256),
                  response=LengthDist(kind="fixed", value=2048))
    r = plan_report(_fleet(), w, top_k=1, cost_model=CM, sim_steps=0, baselines=False, marginal=False)
    gpus = r.plan.gpus_by_type
    assert r.plan.trainer.gpu_type == "H800"
    assert gpus["H20"]["rollout"] > gpus.get("H800", {}).get("rollout", 0)


def test_prefill_heavy_generation_stays_on_h800_when_cost_matters() -> None:
    """Long prompts, one-line answers: generation is compute-bound, and the H20's FLOPs cost more."""
    w = _workload("qwen2.5-7b", eta=4, prompts=64, group=16, prompt=LengthDist(kind="fixed", value=6000),
                  response=LengthDist(kind="fixed", value=16))
    top = plan_report(_fleet(), w, top_k=1, cost_model=CM, sim_steps=0, baselines=False, marginal=False)
    r = plan_report(_fleet(), w, objective="cost", target=0.4 * top.chosen.solution.samples_per_s, top_k=1,
                    cost_model=CM, sim_steps=0, baselines=False, marginal=False)
    assert r.plan.trainer.gpu_type == "H800"
    assert "H20" not in r.plan.gpus_by_type


# ---- explanations ---------------------------------------------------------------------------------
def test_model_fits_no_engine_is_explained() -> None:
    cluster = Cluster(node_groups=({"gpu_type": "L4", "nodes": 2, "gpus_per_node": 2},))
    with pytest.raises(NoPlan, match="fits no rollout engine"):
        plan_report(cluster, _workload("qwen2.5-72b"), cost_model=CM, sim_steps=0)


def test_no_trainer_fits_is_explained() -> None:
    cluster = Cluster(node_groups=({"gpu_type": "H200", "nodes": 1},))
    with pytest.raises(NoPlan, match="no trainer layout"):
        plan_report(cluster, _workload("qwen2.5-72b"), cost_model=CM, sim_steps=0)


def test_async_on_one_node_is_explained() -> None:
    cluster = Cluster(node_groups=({"gpu_type": "H100", "nodes": 1},))
    with pytest.raises(NoPlan, match="at least two nodes"):
        plan_report(cluster, _workload(), cost_model=CM, sim_steps=0)


def test_budget_below_cheapest_plan_is_explained() -> None:
    with pytest.raises(NoPlan, match=r"below the cheapest feasible plan \(\$"):
        plan_report(_h800_h20(), _workload(), budget=1.0, cost_model=CM, sim_steps=0)


def test_target_above_the_fleet_is_explained() -> None:
    with pytest.raises(NoPlan, match="above the most this fleet can do"):
        plan_report(_h800_h20(), _workload(), objective="cost", target=1e7, cost_model=CM, sim_steps=0)


def test_contradictory_requests_are_named() -> None:
    with pytest.raises(SpecError, match="needs a target"):
        plan_report(_h800_h20(), _workload(), objective="cost", cost_model=CM, sim_steps=0)
    with pytest.raises(SpecError, match="budget must be a positive"):
        plan_report(_h800_h20(), _workload(), budget=-5, cost_model=CM, sim_steps=0)


# ---- the report, exports, sweeps -------------------------------------------------------------------
def test_report_simulates_ranked_plans_and_names_the_bottleneck() -> None:
    w = _workload("qwen2.5-7b", eta=2, prompts=32, group=8)
    r = plan_report(_h800_h20(), w, top_k=2, cost_model=CM, sim_steps=4)
    assert [s.name for s in r.ranked[:2]] == ["top-1", "top-2"]  # then the hill-climbs' plans
    assert r.chosen.samples_per_s == max(s.samples_per_s for s in r.ranked)
    assert all(s.simulated is not None and s.simulated.samples_per_s > 0 for s in r.ranked)
    assert r.chosen.solution.bottleneck.split(":")[0] in {"generation", "training", "balanced"}
    assert set(r.marginal) == {"H800", "H20"} and all(v >= 0 for v in r.marginal.values())
    assert {"homogeneous", "split-75/25", "split-50/50", "colocated-sync"} <= set(r.baselines)
    summary = r.summary()
    assert summary["baselines"]["homogeneous"] > 0 and summary["vs_best_homogeneous"] > 0
    # the plan is placed: trainer and engines on disjoint, real nodes
    trainer_nodes = set(r.plan.trainer.nodes)
    engine_nodes = {n for g in r.plan.rollout for n in g.nodes}
    assert trainer_nodes and engine_nodes and not trainer_nodes & engine_nodes
    assert max(trainer_nodes | engine_nodes) < sum(g.nodes for g in _h800_h20().node_groups)
    assert Plan.from_json(r.plan.to_json()) == r.plan


@pytest.mark.parametrize("framework", ["areal", "verl"])
def test_a_framework_plan_still_gets_the_engine_mix_search_within_its_restriction(framework: str) -> None:
    """--framework: the engine-mix hill-climb runs (mix-* plans are simulated), and every plan it
    tries is one the framework launches: one engine kind on whole nodes (planner.frameworks.launches)."""
    w = _workload("qwen2.5-7b", eta=2, prompts=32, group=8)
    r = plan_report(_h800_h20(), w, top_k=1, cost_model=CM, sim_steps=2, baselines=False, marginal=False,
                    refine=0, explore=2, framework=framework)
    mixes = [s for s in r.ranked if s.name.startswith("mix-")]
    assert mixes, "the engine-mix search ran"
    assert all(launches(framework, s.cand, s.solution) for s in r.ranked)
    assert launches(framework, r.chosen.cand, r.chosen.solution)


def test_pareto_costs_rise_with_the_target() -> None:
    frame = pareto(_h800_h20(), _workload("qwen2.5-7b", prompts=32, group=8), points=4, cost_model=CM)
    assert len(frame) == 4
    assert frame.cost_per_hour.is_monotonic_increasing
    assert (frame.samples_per_s >= frame.target * (1 - 1e-6)).all()


def test_what_if_has_one_row_per_variant() -> None:
    w = _workload("qwen2.5-7b", prompts=32, group=8)
    frame = what_if(_h800_h20(), w, [Change("+8 H20", gpus={"H20": 8}), {"name": "eta 0", "workload": {"staleness": 0}},
                                     {"name": "no H800", "gpus": {"H800": -16}}], cost_model=CM, sim_steps=3)
    assert list(frame.variant) == ["baseline", "+8 H20", "eta 0", "no H800"]
    assert frame.loc[1, "samples_per_s"] >= frame.loc[0, "samples_per_s"] * 0.9
    assert frame.loc[1, "H20_rollout"] >= frame.loc[0, "H20_rollout"]
    # the fleet without its H800s still plans (on H20 alone): a failed variant would read 0.0 with a note
    no_h800 = frame.loc[3]
    assert no_h800["note"] == "" and no_h800["samples_per_s"] > 0, no_h800.to_dict()
    assert all(no_h800[c] == 0 for c in frame.columns if c.startswith("H800_"))
    with pytest.raises(SpecError, match="nodes of 8"):
        what_if(_h800_h20(), w, [Change("odd", gpus={"H20": 3})], cost_model=CM, sim_steps=0)


# ---- the CLI ----------------------------------------------------------------------------------------
CLUSTER_YAML = """name: small
node_groups:
  - {gpu_type: H800, nodes: 2}
  - {gpu_type: H20, nodes: 2}
"""
WORKLOAD_YAML = """name: w
model: qwen2.5-1.5b
prompts_per_step: 16
group_size: 8
prompt_len: {kind: fixed, value: 128}
response_len: {kind: lognormal, mean: 500, sigma: 0.8, cap: 2048}
staleness: 2
"""


def test_cli_plan_json_and_plan_file(cli, write, tmp_path) -> None:  # type: ignore[no-untyped-def]
    c, w = write("c.yaml", CLUSTER_YAML), write("w.yaml", WORKLOAD_YAML)
    out = tmp_path / "plan.json"
    r = cli("plan", "--cluster", str(c), "--workload", str(w), "--top-k", "2", "--sim-steps", "3", "--json",
            "--out", str(out))
    assert r.code == 0, r.err
    data = r.json()
    for key in ("samples_per_s", "analytic_samples_per_s", "gpus", "cost_per_hour", "gap", "baselines",
                "exports"):
        assert key in data
    assert set(data["baselines"]) >= {"homogeneous", "split-75/25", "split-50/50", "colocated-sync"}
    plan = Plan.from_json(out.read_text())
    assert plan.predicted["samples_per_s"] == pytest.approx(data["samples_per_s"])
    check = cli("simulate", "--cluster", str(c), "--workload", str(w), "--plan", str(out), "--steps", "3", "--json")
    assert check.code == 0 and check.json()["samples_per_s"] > 0


def test_cli_plan_human_output_and_pareto(cli, write) -> None:  # type: ignore[no-untyped-def]
    c, w = write("c.yaml", CLUSTER_YAML), write("w.yaml", WORKLOAD_YAML)
    r = cli("plan", "--cluster", str(c), "--workload", str(w), "--sim-steps", "2", "--no-baselines")
    assert r.code == 0, r.err
    assert "trainer" in r.out and "samples/s simulated" in r.out and "rlfleet export" in r.out
    p = cli("plan", "--cluster", str(c), "--workload", str(w), "--objective", "pareto", "--json")
    assert p.code == 0 and len(p.json()["pareto"]) >= 2


@pytest.mark.parametrize(("args", "message"), [
    (("--objective", "cost"), "needs a target"),
    (("--budget", "0.5"), "below the cheapest feasible plan"),
    (("--objective", "cost", "--target", "1e9"), "above the most this fleet can do"),
    (("--budget", "-3"), "must be a positive"),
    (("--top-k", "0"), "must be at least 1"),
])
def test_cli_plan_bad_requests_are_one_line(cli, write, args, message) -> None:  # type: ignore[no-untyped-def]
    c, w = write("c.yaml", CLUSTER_YAML), write("w.yaml", WORKLOAD_YAML)
    r = cli("plan", "--cluster", str(c), "--workload", str(w), "--sim-steps", "2", *args)
    assert r.code == 2
    assert message in r.err and len(r.err.strip().splitlines()) == 1 and "Traceback" not in r.err


def test_shipped_mixed_fleet_plan_beats_every_baseline_it_could_run() -> None:
    """The shipped example: the plan out-simulates each baseline that runs on this fleet in its mode (the
    fixed splits), costs no more than any, and generation goes to the H20s, training to the H800s. The
    homogeneous baseline buys as many H800 nodes as the same budget (152 GPUs, beyond the fleet's 64):
    a what-if, printed, not a plan the fleet could run."""
    from planner.api import within
    from traces import example_workload

    r = plan_report(example_cluster("mixed-h800-h20-l40s"), example_workload("qwen2.5-7b-grpo-longtail"))
    summary = r.summary()
    print(f"plan {summary['samples_per_s']:.2f} samples/s; baselines "
          + ", ".join(f"{k} {v:.2f}" for k, v in summary["baselines"].items())
          + f"; vs best homogeneous {summary['vs_best_homogeneous']:.2f}x")
    assert set(summary["baselines"]) == {"homogeneous", "split-75/25", "split-50/50", "colocated-sync"}
    cluster = example_cluster("mixed-h800-h20-l40s")
    assert not within(cluster, r.baselines["homogeneous"].plan)
    for name, rate in summary["baselines"].items():
        if name != "homogeneous":
            assert summary["samples_per_s"] > rate, name
        assert r.baselines[name].solution.cost_per_hour <= r.chosen.solution.cost_per_hour + 1e-6, name
    gpus = r.plan.gpus_by_type
    assert r.plan.trainer.gpu_type == "H800" and gpus["H20"]["rollout"] == 128 and gpus["H20"]["train"] == 0


def test_top_level_plan_returns_a_placed_plan_with_predictions() -> None:
    import planner

    plan = planner.plan(_h800_h20(), _workload(), objective="throughput", budget=60.0, top_k=2, cost_model=CM,
                        sim_steps=3, baselines=False, marginal=False)
    assert isinstance(plan, Plan) and plan.trainer.nodes
    assert plan.predicted["cost_per_hour"] <= 60.0
    assert plan.predicted["samples_per_s"] > 0 and plan.predicted["analytic_samples_per_s"] > 0
