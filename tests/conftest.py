"""Shared fixtures: the CLI run in-process, a loopback Ray cluster, temporary files."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from planner.cli import main

# Ray in tests listens on loopback only (this makes Ray take 127.0.0.1 as every node's address; it
# is read when ray is first imported, so it is set before any test imports it)
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


@dataclass
class CliResult:
    code: int
    out: str
    err: str

    def json(self) -> dict:  # type: ignore[type-arg]
        return json.loads(self.out)


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    """A local Ray on loopback for the toy plan (2 engines, staleness 2), one per test module."""
    ray = pytest.importorskip("ray", reason="ray is part of the runtime extra that make test installs")
    from runtime.ray_start import init_ray
    from runtime.toy import toy_plan

    init_ray(toy_plan(engines=2, staleness=2))
    assert all(n["NodeManagerAddress"] == "127.0.0.1" for n in ray.nodes())  # loopback only
    yield
    ray.shutdown()


@pytest.fixture(scope="session")
def tiny_hf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Qwen2 Hugging Face folder (runtime.tiny_hf), built once per session."""
    pytest.importorskip("transformers", reason="the runtime extra that make test installs")
    from runtime.tiny_hf import tiny_model

    return tiny_model(tmp_path_factory.mktemp("tiny-hf"))


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., CliResult]:
    def run(*argv: str) -> CliResult:
        try:
            code = main(list(argv))
        except SystemExit as exc:  # argparse exits
            code = int(exc.code or 0)
        captured = capsys.readouterr()
        return CliResult(code, captured.out, captured.err)

    return run


@pytest.fixture
def write(tmp_path: Path) -> Callable[[str, str], Path]:
    def _write(name: str, text: str) -> Path:
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        return path

    return _write


@pytest.fixture(autouse=True)
def _one_torch_thread(request: pytest.FixtureRequest) -> Iterator[None]:
    """Runtime tests: tiny matrices gain nothing from a second thread, and on a busy 2-core machine
    torch's spinning OpenMP workers make each op 10-100x slower (measured); results also stop
    depending on the pool."""
    if not request.module.__name__.startswith("test_runtime"):
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
