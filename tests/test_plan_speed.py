"""A request prices once and simulates side by side, with the answers of the one-at-a-time planner (issue 19).

Timings are bench/plan_speed.py's; these tests check that the shortcuts change no answer: a
parallel request equals a serial one bit for bit, a fixed point that settled is not solved twice
with a different answer, and a plan reached twice is simulated once.
"""

from __future__ import annotations

import pytest

from planner.api import plan_report
from planner.milp import solve_async
from planner.scoring import Search, Trial
from traces import Cluster, CostModel, Workload, get_model
from traces.lengths import LengthDist

CM = CostModel.roofline_only()


def _fleet() -> Cluster:
    return Cluster(name="speed-small", node_groups=({"gpu_type": "H800", "nodes": 2}, {"gpu_type": "H20", "nodes": 1}))


def _workload(interruptible: bool = True) -> Workload:
    return Workload(name="speed-small", model=get_model("qwen2.5-1.5b"), prompts_per_step=16, group_size=8,
                    prompt_len=LengthDist(kind="uniform", low=64, high=256),
                    response_len=LengthDist(kind="lognormal", mean=600, sigma=0.8, cap=2048),
                    staleness=2, interruptible=interruptible)


def _answer(workers: int) -> tuple[object, ...]:
    r = plan_report(_fleet(), _workload(), cost_model=CM, sim_steps=4, workers=workers)
    summary = r.summary()
    summary.pop("seconds")
    sims = [(s.name, s.simulated.step_times, s.simulated.trained_ids.tobytes()) for s in r.ranked
            if s.simulated is not None]
    return summary, sims, r.plan.model_dump_json()


def test_parallel_simulations_give_the_serial_report_bit_for_bit() -> None:
    serial, parallel = _answer(workers=1), _answer(workers=2)
    assert serial == parallel
    assert len(serial[1]) >= 3  # the top plans and the climbs were simulated, not skipped


def test_a_parallel_framework_request_gives_the_serial_report() -> None:
    def answer(workers: int) -> dict[str, object]:
        summary = plan_report(_fleet(), _workload(), cost_model=CM, sim_steps=4, framework="verl",
                              workers=workers).summary()
        summary.pop("seconds")
        return summary

    serial = answer(1)
    assert serial == answer(2)
    assert serial["restriction"] is not None and serial["marginal_samples_per_s_per_gpu"]


def test_a_settled_fixed_point_returns_what_solving_it_again_gives() -> None:
    search = Search(CM, _fleet(), _workload(), "throughput", None, None, "auto", 0, 0)
    cand = search.candidates()
    assert any(o.update_seconds for o in cand.engines)  # interruptible: the fixed point runs
    one = solve_async(cand, top_k=1)
    two = solve_async(cand, top_k=2)  # solves the settled MILP again, with its LP bound first
    assert one[0] == two[0]
    assert one[0].lp_bound >= one[0].samples_per_s * (1 - 1e-6)


def test_a_fixed_point_started_at_its_answer_settles_in_one_round(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """`start_rate` (a neighbouring fleet's rate, as the marginal values and the climbs pass it): started
    at the cold fixed point's own rate, one MILP round settles it with no LP rounds before it, on the
    same plan and rate; started far off, the rounds still reach that plan."""
    import pulp

    cand = Search(CM, _fleet(), _workload(), "throughput", None, None, "auto", 0, 0).candidates()
    mips: list[bool] = []  # each solve PuLP is asked: integer (a round, or a further answer) or the LP bound
    solve_once = pulp.LpProblem.solve

    def counted(prob, solver=None, **kw):  # type: ignore[no-untyped-def]
        mips.append(bool(solver.mip))
        return solve_once(prob, solver, **kw)

    monkeypatch.setattr(pulp.LpProblem, "solve", counted)
    cold = solve_async(cand, top_k=1)
    cold_mips, cold_lps = mips.count(True), mips.count(False)
    mips.clear()
    warm = solve_async(cand, top_k=1, start_rate=cold[0].samples_per_s)
    assert cold_lps >= 3 and cold_mips >= 1  # cold: the LP relaxation's fixed point, then MILP rounds
    assert mips.count(True) == 1 and mips.count(False) == 1  # warm: one round, and its LP bound
    assert (warm[0].trainer, warm[0].engines) == (cold[0].trainer, cold[0].engines)
    assert warm[0].samples_per_s == pytest.approx(cold[0].samples_per_s, rel=1e-9)
    far = solve_async(cand, top_k=1, start_rate=cold[0].samples_per_s * 3)
    assert (far[0].trainer, far[0].engines) == (cold[0].trainer, cold[0].engines)

def test_a_placement_reached_twice_is_simulated_once() -> None:
    search = Search(CM, _fleet(), _workload(), "throughput", None, None, "auto", 3, 0)
    cand = search.candidates()
    assert search.candidates() is cand  # candidates once per request
    sol = search.solve(cand, "async")[0]
    assert search.solve(cand, "async")[0] is sol  # the same MILP: one answer
    a, b = search.score_many([Trial("a", cand, sol), Trial("b", cand, sol)])
    assert a is not None and b is not None and a.simulated is b.simulated
    assert search.deadline.simulated == 1
    again = search.score("baseline", cand, sol, where="the baselines", counted=False)
    assert again is not None and again.simulated is a.simulated
    assert search.deadline.simulated == 1


@pytest.mark.parametrize("workers", [1, 2])
def test_the_simulation_bound_stops_a_batch_where_one_at_a_time_would(workers: int) -> None:
    from planner.bounds import Deadline
    from planner.parallel import Simulations

    search = Search(CM, _fleet(), _workload(), "throughput", None, None, "auto", 3, 0,
                    deadline=Deadline(simulations=1), sims=Simulations(workers))
    cand = search.candidates()
    sols = search.solve(cand, "async", 2)
    assert len(sols) == 2
    first, second = search.score_many([Trial("a", cand, sols[0]), Trial("b", cand, sols[1])])
    search.sims.close()
    assert first is not None and second is None
    assert search.deadline.hit is not None and "1 simulated plans" in search.deadline.hit


def _replanned(cluster: Cluster, workload: Workload, budget: float | None) -> dict[str, float]:
    """Marginal values the long way: candidates and the MILP from scratch for each fleet with one more node."""
    from planner.candidates import candidates
    from planner.milp import solve

    def best(c: Cluster) -> float:
        found = solve(candidates(CM, c, workload), workload.mode, "throughput", budget, None, 1)
        return found[0].samples_per_s if found else 0.0

    out = {}
    for i, g in enumerate(cluster.node_groups):
        groups = list(cluster.node_groups)
        groups[i] = g.model_copy(update={"nodes": g.nodes + 1})
        out[g.gpu_type] = max(best(cluster.model_copy(update={"node_groups": tuple(groups)})) - best(cluster), 0.0) \
            / g.gpus_per_node
    return out


@pytest.mark.parametrize(("groups", "budget", "mode"), [
    (({"gpu_type": "H800", "nodes": 2}, {"gpu_type": "H20", "nodes": 1}), None, "async"),
    (({"gpu_type": "A100-80G", "nodes": 1}, {"gpu_type": "L40S", "nodes": 3}), 60.0, "async"),
    (({"gpu_type": "H100", "nodes": 2}, {"gpu_type": "L40S", "nodes": 1}), None, "sync"),
])
def test_marginal_values_agree_with_replanning_each_fleet(groups: tuple[dict[str, object], ...], budget: float | None,
                                                          mode: str) -> None:
    cluster = Cluster(name="speed-marginal", node_groups=groups)
    workload = _workload().model_copy(update={"mode": mode, "staleness": 2 if mode == "async" else 0})
    report = plan_report(cluster, workload, cost_model=CM, sim_steps=0, baselines=False, budget=budget)
    want = _replanned(cluster, workload, budget)
    assert report.marginal.keys() == want.keys()
    assert any(v > 0 for v in want.values())  # a case where one more node buys something
    for name, value in want.items():
        assert report.marginal[name] == pytest.approx(value, rel=0.02, abs=1e-6)


def test_milp_only_answers_the_milp_alone(cli) -> None:  # type: ignore[no-untyped-def]
    args = ("plan", "--cluster", "traces/data/clusters/h800-h20-l40s-4node.yaml",
            "--workload", "traces/data/workloads/qwen2.5-1.5b-math-short.yaml")
    out = cli(*args, "--milp-only", "--json")
    assert out.code == 0, out.err
    got = out.json()
    assert got["samples_per_s"] == got["analytic_samples_per_s"]  # nothing simulated
    assert got["baselines"] == {} and got["marginal_samples_per_s_per_gpu"] == {}
    assert all(r["name"].startswith("top-") for r in got["ranked"])  # no refinement, no engine-mix moves
    assert 0 <= got["gap"] <= 1e-4  # the proven gap is still reported
    text = cli(*args, "--milp-only")
    assert "analytic, not simulated" in text.out
    bad = cli(*args, "--milp-only", "--objective", "pareto")
    assert bad.code == 2 and len(bad.err.strip().splitlines()) == 1 and "--milp-only" in bad.err


def test_solves_in_workers_answer_as_one_at_a_time_and_give_stdout_back() -> None:
    import os

    from planner.parallel import Simulations

    before = os.fstat(1)
    serial = Search(CM, _fleet(), _workload(), "throughput", None, None, "auto", 0, 0)
    threaded = Search(CM, _fleet(), _workload(), "throughput", None, None, "auto", 0, 0, sims=Simulations(2))
    cand = serial.candidates()
    jobs = [(cand, "async", 1, {}), (cand, "async", 2, {}), (cand, "async", 1, {"budget": 40.0}),
            (cand, "sync", 1, {})]
    threaded.sims.start()
    serial.solve(cand, "async")  # HiGHS started in this process: the workers' solves run in threads of their own
    assert serial.solve_many(jobs) == threaded.solve_many(jobs)  # type: ignore[arg-type]
    threaded.sims.close()
    after = os.fstat(1)
    assert (before.st_dev, before.st_ino) == (after.st_dev, after.st_ino)  # not left on /dev/null


def test_marginal_values_are_not_cut_short_by_a_spent_request_clock() -> None:
    from planner.bounds import Deadline
    from planner.marginal import marginal_values

    cluster, workload = _fleet(), _workload()
    spent = Deadline(seconds=0.0)
    search = Search(CM, cluster, workload, "throughput", None, None, "auto", 0, 0, deadline=spent)
    got = marginal_values(search, "async", None)
    want = _replanned(cluster, workload, None)
    assert any(v > 0 for v in want.values())
    assert got == pytest.approx(want, rel=0.02, abs=1e-6)


def _plan_in_a_daemon(_: int) -> float:
    return plan_report(_fleet(), _workload(), cost_model=CM, sim_steps=2, baselines=False, marginal=False).chosen \
        .samples_per_s


def test_a_request_inside_a_pool_worker_runs_its_simulations_in_place() -> None:
    import multiprocessing

    # a Pool's workers are daemons: they may not fork. Spawned, not forked: a child forked from a
    # process whose HiGHS has started its threads spins in its own first solve (HiGHS's scheduler)
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        inside = pool.map(_plan_in_a_daemon, [0])[0]
    assert inside == _plan_in_a_daemon(0)
