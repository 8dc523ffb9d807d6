"""The planner's bounds hold inside every long loop, and a bound that stops a search says so in one line."""

from __future__ import annotations

import pytest

from planner.api import plan_report
from planner.bounds import SETTLING_RUNS, Deadline
from planner.candidates import candidates
from planner.milp import solve_async, solve_sync
from sim import simulate
from traces import Cluster, CostModel, SpecError, Workload, example_cluster, example_workload, get_model
from traces.lengths import LengthDist

CM = CostModel.roofline_only()
FLEET = Cluster(name="two-kinds", node_groups=({"gpu_type": "H800", "nodes": 2, "gpus_per_node": 8},
                                               {"gpu_type": "H20", "nodes": 2, "gpus_per_node": 8}))


def _job(mode: str = "async", interruptible: bool = False) -> Workload:
    return Workload(model=get_model("qwen2.5-1.5b"), prompts_per_step=16, group_size=8,
                    prompt_len=LengthDist(kind="uniform", low=64, high=256),
                    response_len=LengthDist(kind="lognormal", mean=600, sigma=0.8, cap=2048), mode=mode,
                    staleness=2 if mode == "async" else 0, interruptible=interruptible)


def test_the_simulation_count_bound_stops_re_ranking_with_a_note() -> None:
    # a bound of 4: 2 screening runs, and 2 held back for settling runs (planner.bounds.Deadline.reserved)
    r = plan_report(FLEET, _job(), cost_model=CM, baselines=False, marginal=False, max_simulations=4)
    assert len({s.plan.model_dump_json() for s in r.ranked}) == 2  # a plan met again is not simulated again
    assert r.chosen.confirmed and r.chosen.samples_per_s == max(s.samples_per_s for s in r.ranked if s.confirmed)
    assert r.notes[0] == "re-ranking stopped at the planner's bound of 4 simulated plans"
    assert r.summary()["notes"] == list(r.notes)


def test_the_count_bound_stops_the_trainer_refinement_and_the_engine_mix_search() -> None:
    one = plan_report(FLEET, _job(), cost_model=CM, baselines=False, marginal=False, top_k=1, max_simulations=1)
    assert one.notes == ("the trainer refinement stopped at the planner's bound of 1 simulated plans",)
    mixes = plan_report(FLEET, _job(), cost_model=CM, baselines=False, marginal=False, top_k=1, refine=0,
                        max_simulations=4)  # 2 screening runs, 2 held back for settling
    assert mixes.notes[0] == "the engine-mix search stopped at the planner's bound of 4 simulated plans"
    assert len({s.plan.model_dump_json() for s in mixes.ranked}) == 2
    free = plan_report(FLEET, _job(), cost_model=CM, baselines=False, marginal=False, top_k=1, refine=0)
    assert free.notes == () and len(free.ranked) > 2  # the bound, not the search, stopped it above


def test_a_spent_clock_before_any_plan_is_one_line() -> None:
    with pytest.raises(SpecError, match=r"^planning stopped before any plan was found: .* bound; raise --max-seconds"):
        plan_report(FLEET, _job(), cost_model=CM, baselines=False, marginal=False, max_seconds=1e-9)


def test_the_cli_names_the_bound(cli, write) -> None:  # type: ignore[no-untyped-def]
    fleet = write("c.yaml", "node_groups:\n  - {gpu_type: H800, nodes: 2}\n  - {gpu_type: H20, nodes: 2}\n")
    job = write("w.yaml", "model: qwen2.5-1.5b\nprompts_per_step: 16\ngroup_size: 8\nstaleness: 2\n"
                "prompt_len: {kind: uniform, low: 64, high: 256}\nresponse_len: {kind: fixed, value: 300}\n")
    out = cli("plan", "--cluster", str(fleet), "--workload", str(job), "--no-baselines", "--max-seconds", "1e-9")
    assert out.code == 2 and out.err.count("\n") == 1 and "planning stopped before any plan was found" in out.err
    ok = cli("plan", "--cluster", str(fleet), "--workload", str(job), "--no-baselines", "--max-simulations", "1")
    assert ok.code == 0 and "note: re-ranking stopped at the planner's bound of 1 simulated plans" in ok.out


def test_the_on_policy_enumeration_stops_at_its_solve_bound() -> None:
    cand = candidates(CM, FLEET, _job("sync"))
    whole = solve_sync(cand)
    bounded = Deadline(solves=1)
    cut = solve_sync(cand, deadline=bounded)
    assert bounded.hit == "the on-policy enumeration stopped at the planner's bound of 1 MILP solves"
    assert cut and whole and cut[0].samples_per_s <= whole[0].samples_per_s


def test_the_fixed_point_rounds_stop_at_the_clock() -> None:
    cand = candidates(CM, FLEET, _job(interruptible=True))
    assert any(o.update_seconds for o in cand.engines)
    spent = Deadline(seconds=0.0)
    found = solve_async(cand, deadline=spent)
    assert spent.hit == "the interruptible fixed point stopped at the planner's 0 s bound"
    assert found  # the last solve still runs: an answer at the undetermined period


def test_a_simulation_stops_at_the_wall_clock_it_is_given() -> None:
    cluster, workload = example_cluster("mixed-h800-h20-l40s"), example_workload("qwen2.5-7b-grpo-longtail")
    plan = plan_report(cluster, workload, cost_model=CM, baselines=False, marginal=False, sim_steps=0).plan
    with pytest.raises(SpecError, match=r"^simulation ran past 0.001 s; simulate fewer steps"):
        simulate(cluster, workload, plan, CM, steps=10, wall_seconds=0.001)


def test_settling_runs_count_against_the_simulation_bound() -> None:
    free = plan_report(FLEET, _job(), cost_model=CM, baselines=False, marginal=False)
    screened = len({s.job.key() for s in free.ranked if s.job is not None})
    assert free.chosen.confirmed and free.notes == ()
    # a bound the free search's screening runs fill exactly: its last runs are held back for settling, so
    # the search screens fewer plans and the answer is still settled; screening and settling fit the bound
    capped = plan_report(FLEET, _job(), cost_model=CM, baselines=False, marginal=False, max_simulations=screened)
    held = min(SETTLING_RUNS, screened // 2)
    runs = {s.job.key() for s in capped.ranked if s.job is not None}
    settled = {s.job.key() for s in capped.ranked if s.confirmed and s.job is not None}
    assert capped.chosen.confirmed and len(runs) <= screened - held and len(runs) + len(settled) <= screened
    assert capped.notes[0].endswith(f"stopped at the planner's bound of {screened} simulated plans")
