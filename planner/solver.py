"""The MILP solver: HiGHS through highspy (one thread, time-limited), PuLP's bundled CBC as the fallback."""

from __future__ import annotations

import math
from types import MappingProxyType

import pulp

from planner.quiet_stdout import quiet_stdout
from traces import SpecError

SOLVE_SECONDS = 60  # a bound on any one solve, so no input can hang the planner
# HiGHS on one thread: these MILPs are small (most close at the root node), and a second thread only
# competes for the cores with the request's other solves and simulations (issue 19: the demo's
# serial request 10.0 -> 6.8 CPU s; the same integer answers on 2,099 MILPs of bench/same_plans' cases)
HIGHS_THREADS = 1
# No RINS/RENS sub-MIPs and no restarts: these MILPs close at or near the root, where HiGHS spent
# most of a solve in sub-MIP heuristics (0.19 of 0.33 s on the demo's slowest) and re-presolving
# after fixing columns (issue 19: the demo's slowest MILPs 2-3x faster, the same optima)
HIGHS_MIP_OPTIONS = MappingProxyType({"mip_heuristic_run_rins": False, "mip_heuristic_run_rens": False,
                                      "mip_allow_restart": False})


def solver(name: str = "auto", mip: bool = True, seconds: float = SOLVE_SECONDS,
           threads: int | None = None) -> pulp.LpSolver:
    """HiGHS (via highspy) when installed, else PuLP's bundled CBC; `name` forces one.
    `threads`: HiGHS's thread count (None: HIGHS_THREADS; 0: HiGHS's own choice)."""
    if name not in ("auto", "highs", "cbc"):
        raise SpecError(f"unknown solver '{name}'; use auto, highs or cbc")
    limit = max(1, min(SOLVE_SECONDS, round(seconds)))
    if name in ("auto", "highs"):
        highs = pulp.HiGHS(mip=mip, msg=False, timeLimit=limit, gapRel=1e-7,
                           threads=HIGHS_THREADS if threads is None else threads, **(HIGHS_MIP_OPTIONS if mip else {}))
        if highs.available():
            return highs
        if name == "highs":
            raise SpecError("solver 'highs' is not installed (pip install highspy); use --solver cbc")
    return pulp.PULP_CBC_CMD(mip=mip, msg=False, timeLimit=limit, gapRel=1e-7)


def solved(prob: pulp.LpProblem, solver_name: str, relax: bool, seconds: float) -> bool:
    """`prob` solved (without integrality if `relax`) within `seconds`: whether to optimality."""
    with quiet_stdout():  # highspy prints a banner on stdout before PuLP can silence it
        status = prob.solve(solver(solver_name, mip=not relax, seconds=seconds))
        if _refused(prob):  # this thread's HiGHS scheduler was started with more threads: take its count
            status = prob.solve(solver(solver_name, mip=not relax, seconds=seconds, threads=0))
    return pulp.LpStatus[status] == "Optimal"


def _refused(prob: pulp.LpProblem) -> bool:
    """Whether HiGHS refused to run at all: it keeps one task scheduler per thread, and a solve in
    this thread outside the planner may have started it with another thread count than HIGHS_THREADS."""
    highs = getattr(prob, "solverModel", None)
    if highs is None or not hasattr(highs, "getModelStatus"):  # CBC
        return False
    import highspy  # loaded already: PuLP's HiGHS solved this model

    return bool(highs.getModelStatus() == highspy.HighsModelStatus.kNotset)


def proven_gap(prob: pulp.LpProblem) -> float:
    """The solver's own optimality gap: HiGHS reports it; CBC's Optimal means within gapRel."""
    info = getattr(getattr(prob, "solverModel", None), "getInfo", None)
    if info is None:
        return 0.0
    gap = float(info().mip_gap)
    return gap if math.isfinite(gap) and gap >= 0 else 0.0
