"""The simulator's structure: imports point one way, the reference stands apart, and the shared
rules in traces (routing policy, capacity ledger) answer as their definitions do."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from traces.capacity import CapacityLedger
from traces.routing import Router, deal, route_one_by_one
from traces.staleness import CapacityController

ROOT = Path(__file__).resolve().parent.parent


def _imports(package: str) -> dict[str, set[str]]:
    """Module -> the modules of the project it imports (TYPE_CHECKING blocks included)."""
    out: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module)
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
        out[name] = {m for m in found if m.split(".")[0] in ("sim", "traces", "planner", "runtime")}
    return out


def test_no_import_circle_in_sim() -> None:
    graph = _imports("sim")
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for n in sorted(graph.get(m, ())):
            if n not in graph or n == m or n in ("sim",):
                continue
            assert state.get(n) != 1, f"import circle: {' -> '.join([*path, n])}"
            if n not in state:
                visit(n, [*path, n])
        state[m] = 2

    for m in graph:
        if m not in state:
            visit(m, [m])


def test_reference_imports_only_traces_and_the_shared_trainer_and_recorder() -> None:
    allowed = {"sim.trainer", "sim.recorder"}
    for module, deps in _imports("sim").items():
        if module.startswith("sim.reference"):
            bad = {d for d in deps if not (d.startswith(("traces", "sim.reference")) or d in allowed)}
            assert not bad, f"{module} imports {bad}"


def test_traces_imports_nothing_above_it() -> None:
    for module, deps in _imports("traces").items():
        assert all(d.startswith("traces") for d in deps), (module, deps)


@pytest.mark.parametrize("seed", range(3))
def test_router_takes_python_lists_and_routes_by_the_definition(seed: int) -> None:
    """Router on plain lists (as the runtime will call it) gives the one-at-a-time heap's choice,
    and deal groups the sends per engine in the order engines got their first request."""
    rng = np.random.default_rng(seed)
    for _ in range(50):
        engines, width = int(rng.integers(1, 8)), int(rng.integers(3, 9))
        tables = [[0.0, *sorted(np.round(rng.uniform(0.01, 0.05, width - 1), 3).tolist())] for _ in range(engines)]
        caps = rng.integers(1, width, engines).tolist()
        loads = [int(rng.integers(0, c)) for c in caps]
        accepting = (rng.random(engines) < 0.8).tolist()
        n = int(rng.integers(1, 40))
        got = Router(tables, caps).route(n, accepting, loads)
        idx = np.flatnonzero(accepting)
        keys = np.array(tables)[idx]
        want = route_one_by_one(n, idx, np.array(loads)[idx], np.array(caps)[idx], keys)
        assert got.tolist() == want.tolist()
        ids = np.arange(100, 100 + len(got))
        sent = deal(got, ids)
        assert sorted(np.concatenate([s for _, s in sent]).tolist()) == ids.tolist() if len(got) else sent == []
        assert [int(s[0]) for _, s in sent] == sorted(int(s[0]) for _, s in sent)
        for e, s in sent:
            assert (got[s - 100] == e).all()


def test_router_docstring_example() -> None:
    router = Router([[0.0, 0.010, 0.011], [0.0, 0.020, 0.021]], capacities=[2, 2])
    assert router.route(3, accepting=[True, True], loads=[0, 1]).tolist() == [0, 0, 1]


@pytest.mark.parametrize("eta", [0, 1, 3])
def test_capacity_ledger_agrees_with_the_runtime_capacity_controller(eta: int) -> None:
    """The simulators' ledger (id chunks per level) admits, readies and takes what the runtime's
    CapacityController (one item at a time) does, on a random run of completions."""
    batch, total = 4, 200
    rng = np.random.default_rng(eta)
    ledger: CapacityLedger[np.ndarray] = CapacityLedger(batch, eta, total)
    ctl: CapacityController[int] = CapacityController(batch, eta)
    flying: list[tuple[int, int]] = []  # (uid, start version)
    step = 0
    while step < 20:
        n = min(ledger.allowance(), ctl.allowance(), total - ledger.admitted)
        assert ledger.allowance() == min(ctl.allowance(), total - ledger.admitted)
        first = ledger.admit(n)
        for uid in range(first, first + n):
            assert ctl.admit() == (uid, ledger.version)
            flying.append((uid, ledger.version))
        done = [flying.pop(int(rng.integers(len(flying)))) for _ in range(min(len(flying), int(rng.integers(1, 6))))]
        for uid, level in done:
            ledger.buffer(level, np.array([uid]), 1)
            ctl.complete(uid, level, uid)
        assert ledger.ready(step) == ctl.ready(step)
        if ledger.ready(step):
            took = np.concatenate(ledger.take(lambda chunks: np.sort(np.concatenate(chunks))))
            assert took.tolist() == [a.uid for a in ctl.take()]
            step += 1
            ledger.version = step
            ctl.new_version(step)
        if not flying and not ledger.ready(step) and ledger.allowance() <= 0:
            break
    assert step > 3
