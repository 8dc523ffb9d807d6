"""What a recorded toy run must show whatever its engines: it learned, it kept the staleness bound, it lost nothing.

Shared by the engine tests (tests/test_runtime_vllm_loop.py, tests/test_runtime_vllm_local.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from runtime.records import read_metrics


def check_toy_run(summary: dict[str, Any], folder: Path, steps: int, eta: int, groups_per_step: int) -> None:
    """Assert, from `rlfleet run --json`'s summary and the run folder's metrics, that the run:
    - trained `steps` steps;
    - learned: the last ten steps' mean reward over 3x the first ten's and over 0.02, and the
      evaluation after over twice the one before;
    - kept the bound: no step and no trained token older than `eta` versions;
    - lost nothing: every trained group once, `groups_per_step` a step, and a group admitted but never
      trained is one still in flight at the end (among the last (eta + 1) steps' admissions)."""
    rows = read_metrics(folder)
    assert summary["steps"] == steps and [r["step"] for r in rows] == list(range(steps))
    first = sum(r["mean_reward"] for r in rows[:10]) / 10
    last = sum(r["mean_reward"] for r in rows[-10:]) / 10
    print(f"\n{summary['engine']} engines ({summary['executor']}): reward first ten {first:.4f}, last ten "
          f"{last:.4f}; eval {summary['eval_before']:.4f} -> {summary['eval_after']:.4f}; {summary['seconds']:.1f} s")
    assert last > 3 * first and last > 0.02
    assert summary["eval_after"] > 2 * summary["eval_before"]
    assert summary["max_staleness"] <= eta and all(r["max_staleness"] <= eta for r in rows)
    assert all(int(lag) <= eta for r in rows for lag in r["staleness_tokens"])
    trained = [uid for r in rows for uid in r["groups"]]
    assert len(trained) == len(set(trained)) == steps * groups_per_step
    missing = set(range(max(trained) + 1)) - set(trained)
    assert all(uid > max(trained) - (eta + 1) * groups_per_step for uid in missing), sorted(missing)
    assert summary["samples_regenerated"] == 0 and summary["duplicates_dropped"] == 0
