"""Inputs at the edges, generated: float edge values in every numeric field of the cluster, workload
and plan files, a key given twice in every mapping, and path mistakes for every file argument.

Each generator starts from a small valid document (BASE_*) that sets every numeric field, so
"every numeric field" is every number in these documents, found by walking them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

EDGE_VALUES: tuple[Any, ...] = (1e-300, 1e308, float("nan"), float("inf"), float("-inf"), -0.0, 0, -1, 0.5,
                                2**63, 5e-324, 1e-320, -1e308, 1.7976931348623157e308)

MODEL = {"name": "edge-model", "layers": 4, "hidden": 256, "heads": 4, "kv_heads": 2, "head_dim": 64,
         "intermediate": 1024, "vocab": 1000, "bytes_per_param": 2.0}
BASE_CLUSTER: dict[str, Any] = {
    "name": "edge", "links": [{"a": "a", "b": "b", "gb_per_s": 12.5}],
    "node_groups": [
        {"gpu_type": "H100", "nodes": 1, "gpus_per_node": 8, "inter_node_gb_per_s": 50.0, "label": "a",
         "price_per_gpu_hour": 2.5},
        {"gpu_type": "H20", "nodes": 1, "gpus_per_node": 8, "inter_node_gb_per_s": 25.0, "label": "b",
         "price_per_gpu_hour": 1.0},
    ],
}
BASE_WORKLOADS: tuple[dict[str, Any], ...] = (
    {"name": "edge", "model": MODEL, "algorithm": "ppo", "prompts_per_step": 4, "group_size": 4,
     "prompt_len": {"kind": "uniform", "low": 8, "high": 32},
     "response_len": {"kind": "lognormal", "mean": 64.0, "sigma": 0.5, "cap": 256},
     "mode": "async", "staleness": 1, "reward_seconds": 0.01, "ppo_minibatches": 2},
    {"name": "edge", "model": "qwen2.5-1.5b", "prompts_per_step": 2, "group_size": 2,
     "prompt_len": {"kind": "fixed", "value": 16},
     "response_len": {"kind": "empirical", "lengths": [16, 32, 64], "counts": [1.0, 2.0, 1.0]}},
)
BASE_PLAN: dict[str, Any] = {
    "schema_version": 1, "mode": "async", "staleness": 1,
    "rollout": [{"gpu_type": "H20", "tp": 1, "instances": 4, "nodes": [1]}],
    "trainer": {"gpu_type": "H100", "dp": 8, "tp": 1, "pp": 1, "zero_stage": 3, "nodes": [0]},
    "max_concurrent_rollouts": 64, "predicted": {"samples_per_s": 10.0},
}
BASES: tuple[tuple[str, dict[str, Any]], ...] = (
    ("cluster", BASE_CLUSTER), *(("workload", w) for w in BASE_WORKLOADS), ("plan", BASE_PLAN))


def number_paths(doc: Any, here: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """The path (keys and indices) of every number in a document; bools are not numbers here."""
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield from number_paths(value, (*here, key))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            yield from number_paths(value, (*here, i))
    elif isinstance(doc, (int, float)) and not isinstance(doc, bool):
        yield here


def replaced(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    """A deep copy of `doc` with the leaf at `path` set to `value`."""
    if not path:
        return value
    if isinstance(doc, dict):
        return {k: replaced(v, path[1:], value) if k == path[0] else v for k, v in doc.items()}
    return [replaced(v, path[1:], value) if i == path[0] else v for i, v in enumerate(doc)]


def to_text(doc: Any, as_json: bool) -> str:
    """YAML (which spells NaN `.nan`) or JSON (`NaN`, as a hand-written plan might)."""
    return json.dumps(doc) if as_json else yaml.safe_dump(doc)


def float_edges() -> Iterator[tuple[str, dict[str, Any], str]]:
    """(which file, the base documents with one file changed, a label) for every numeric field and
    every edge value."""
    for which, base in BASES:
        for path in number_paths(base):
            for value in EDGE_VALUES:
                yield which, replaced(base, path, value), f"{which}: {'.'.join(map(str, path))} = {value!r}"


# CSV inputs: a length histogram (a workload's `file:`) and a measured cost table (--profile)
HISTOGRAM = ("length", "count"), ((16, 1.0), (32, 2.0), (64, 1.0))
PROFILE = (("gpu_type", "model", "stage", "tp", "pp", "dp", "batch", "context", "tokens", "seconds", "source"),
           (("H20", "qwen2.5-1.5b", "decode", 1, 1, 1, 8, 512, 0, 0.01, "edge"),
            ("H20", "qwen2.5-1.5b", "decode", 1, 1, 1, 64, 2048, 0, 0.05, "edge")))


def csv_edges(table: tuple[tuple[str, ...], tuple[tuple[Any, ...], ...]]) -> Iterator[tuple[str, str]]:
    """(CSV text with one number replaced by an edge value, a label) for every number of the first
    row and every edge value."""
    header, rows = table
    for col, cell in enumerate(rows[0]):
        if isinstance(cell, str):
            continue
        for value in EDGE_VALUES:
            first = tuple(value if i == col else v for i, v in enumerate(rows[0]))
            lines = [",".join(header), *(",".join(map(str, r)) for r in (first, *rows[1:]))]
            yield "\n".join(lines) + "\n", f"{header[col]} = {value!r}"


def mappings(doc: Any, here: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """The path of every mapping in a document."""
    if isinstance(doc, dict):
        yield here
        for key, value in doc.items():
            yield from mappings(value, (*here, key))
    elif isinstance(doc, list):
        for i, value in enumerate(doc):
            yield from mappings(value, (*here, i))


def with_duplicate(doc: Any, target: tuple[Any, ...], key: str, here: tuple[Any, ...] = ()) -> str:
    """JSON text (JSON is YAML) of `doc` in which the mapping at `target` gives `key` twice."""
    if isinstance(doc, dict):
        items = list(doc.items()) + ([(key, doc[key])] if here == target else [])
        return "{" + ", ".join(f"{json.dumps(k)}: {with_duplicate(v, target, key, (*here, k))}" for k, v in items) + "}"
    if isinstance(doc, list):
        return "[" + ", ".join(with_duplicate(v, target, key, (*here, i)) for i, v in enumerate(doc)) + "]"
    return json.dumps(doc)


def duplicate_keys() -> Iterator[tuple[str, str, str]]:
    """(which file, its text with one key given twice, the key) for every key of every mapping."""
    for which, base in BASES:
        for target in mappings(base):
            node = base
            for part in target:
                node = node[part]
            for key in node:
                yield which, with_duplicate(base, target, key), key


def path_mistakes(root: Path) -> dict[str, Path]:
    """Paths that are not a usable file, made under `root`: each name says what it is."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "a-file").write_text("x: 1\n")
    (root / "a-folder").mkdir(exist_ok=True)
    paths = {
        "missing": root / "missing.yaml", "folder": root / "a-folder", "under-a-file": root / "a-file" / "x.yaml",
        "link-loop": root / "loop-a", "fifo": root / "fifo", "link-to-dev-null": root / "null-link",
        "dangling-link-under-a-file": root / "dangling", "name-too-long": root / ("x" * 300),
    }
    for name, path in (("loop-a", "loop-b"), ("loop-b", "loop-a"), ("null-link", "/dev/null"),
                       ("dangling", "a-file/none")):
        if not os.path.lexists(root / name):
            os.symlink(path, root / name)
    if not os.path.lexists(root / "fifo"):
        os.mkfifo(root / "fifo")
    if os.path.isdir("/sys/kernel"):  # sysfs refuses new files even to root: a folder no one may write in
        paths["unwritable-folder"] = Path("/sys/kernel/rlfleet-test.out")
    return paths
