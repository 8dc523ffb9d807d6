"""Imports point only down (planner -> sim -> traces; runtime -> traces), and no package's modules import in a circle.

Read from the source with `ast`, every import counted wherever it stands: a function-local import
still makes its module depend on the other (it only defers the failure). The runtime ships without
the simulator and the planner, so its imports may reach `traces` alone.
"""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("traces", "sim", "planner", "runtime")
FORBIDDEN = {"traces": {"sim", "planner", "runtime"}, "sim": {"planner", "runtime"}, "runtime": {"planner", "sim"}}

Graph = dict[str, set[str]]  # module -> the modules of the four packages it imports


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(path: Path, module: str) -> set[str]:
    """Every dotted name an import in `path` names: `import a.b` gives a.b, `from a.b import c` gives a.b.c
    (c may be a module, or a name in a.b); relative imports resolved against `module`'s package. Imports
    under `if TYPE_CHECKING:` never run (annotations only) and are left out."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    names: set[str] = set()
    pending: list[ast.AST] = [ast.parse(path.read_text(encoding="utf-8"), filename=str(path))]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            pending.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package[:len(package) - node.level + 1], *([base] if base else [])])
            names.update(f"{base}.{alias.name}" for alias in node.names)
        pending.extend(ast.iter_child_nodes(node))
    return names


def import_graph(root: Path = ROOT) -> Graph:
    """Each module of the four packages and the modules of theirs it imports: a dotted name stands for
    the longest module it starts with (`traces.Plan` for traces, `sim.x.y` for sim.x if that exists).
    A package's __init__, which Python runs before any of its modules, counts only where it is named."""
    files = {module_name(p, root): p for pkg in PACKAGES for p in sorted((root / pkg).rglob("*.py"))}
    graph: Graph = {}
    for name, path in files.items():
        graph[name] = set()
        for target in imported_names(path, name):
            parts = target.split(".")
            owner = next((".".join(parts[:n]) for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in files), None)
            if owner is not None and owner != name:
                graph[name].add(owner)
    return graph


def layering_violations(graph: Graph) -> list[str]:
    return sorted(f"{a} imports {b}" for a, targets in graph.items() for b in targets
                  if b.split(".")[0] in FORBIDDEN.get(a.split(".")[0], set()))


def cycle_within(graph: Graph, package: str) -> list[str]:
    """One import cycle among `package`'s modules (graphlib names one when it finds any), or []."""
    inner = {a: {b for b in targets if b.split(".")[0] == package} for a, targets in graph.items()
             if a.split(".")[0] == package}
    try:
        TopologicalSorter(inner).prepare()
    except CycleError as exc:
        return list(exc.args[1])
    return []


def test_the_graph_holds_module_level_function_local_and_relative_imports(tmp_path: Path) -> None:
    graph = import_graph()
    assert "planner.commands.args" in graph["planner.commands.run"]  # module level
    assert "planner.commands.run" in graph["planner.cli"]  # inside build_parser
    assert "traces" in graph["runtime.ray_start"]  # `from traces import Plan`: the package's __init__
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "__init__.py").write_text("from .io import x\nVERSION = 1\n", encoding="utf-8")
    (tmp_path / "traces" / "io.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                               "    from traces import sim\ndef f():\n    from . import errors\n",
                                               encoding="utf-8")
    (tmp_path / "traces" / "errors.py").write_text("from traces import VERSION, io\n", encoding="utf-8")
    small = import_graph(tmp_path)
    # `.io` from the package; `from . import errors` a module (`traces.sim`, for annotations only, is not);
    # `VERSION` a name in the package's __init__
    assert small == {"traces": {"traces.io"}, "traces.io": {"traces.errors"}, "traces.errors": {"traces", "traces.io"}}
    assert {"traces.io", "traces.errors"} <= set(cycle_within(small, "traces"))  # either cycle holds both


def test_the_checks_catch_a_layering_violation_and_a_cycle() -> None:
    graph = {"runtime.a": {"sim.b"}, "sim.b": set(), "planner.x": {"planner.y"}, "planner.y": {"planner.x"}}
    assert layering_violations(graph) == ["runtime.a imports sim.b"]
    assert sorted(set(cycle_within(graph, "planner"))) == ["planner.x", "planner.y"]
    assert cycle_within(graph, "runtime") == []


def test_imports_point_only_down() -> None:
    assert layering_violations(import_graph()) == []


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle_within_a_package(package: str) -> None:
    assert cycle_within(import_graph(), package) == []
