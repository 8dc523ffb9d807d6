"""Files survive a killed writer; seeded results are byte-identical across processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

WRITER = """
import sys
from traces.io import atomic_write_bytes
chunk = b"new" * (1 << 20)
print("ready", flush=True)
while True:  # rewrite a large file until killed: some kill lands mid-write
    atomic_write_bytes(sys.argv[1], chunk * 64)
"""


def test_killed_writer_leaves_the_old_file_or_the_new_one(tmp_path: Path) -> None:
    target = tmp_path / "plan.json"
    old = b'{"schema_version": 1}\n'
    torn = 0  # kills that landed mid-write (they leave the writer's temp file behind)
    for delay in (0.05, 0.15, 0.3, 0.5, 0.8):
        target.write_bytes(old)
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(target)], stdout=subprocess.PIPE)
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        time.sleep(delay)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        data = target.read_bytes()
        assert data == old or data == b"new" * (1 << 20) * 64, len(data)  # never a torn file
        leftovers = list(tmp_path.glob(".plan.json.*.tmp"))
        torn += bool(leftovers)
        for f in leftovers:
            f.unlink()
    assert torn >= 1  # the test did kill a write in progress


def _cli(*argv: str) -> bytes:
    out = subprocess.run([sys.executable, "-m", "planner.cli", *argv], capture_output=True, check=True,
                         env={**os.environ, "PYTHONHASHSEED": str(os.getpid())})  # differ per process
    return out.stdout


def test_seeded_results_are_byte_identical_across_processes(tmp_path: Path) -> None:
    c = "traces/data/clusters/mixed-h800-h20-l40s.yaml"
    w = "traces/data/workloads/qwen2.5-1.5b-math-short.yaml"
    sim = ["simulate", "--cluster", c, "--workload", w, "--plan", "traces/data/plans/mixed-math-short.json",
           "--steps", "4", "--seed", "3", "--json"]
    assert _cli(*sim) == _cli(*sim)
    plans = []
    for i in range(2):
        out = tmp_path / f"plan{i}.json"
        _cli("plan", "--cluster", c, "--workload", w, "--sim-steps", "3", "--top-k", "2", "--out", str(out))
        plans.append(out.read_bytes())
    assert plans[0] == plans[1]
