"""Data-parallel trainer ranks in the Ray loop (real Ray on loopback, real DDP over gloo on CPU).

- `rlfleet run` of a plan whose trainer has dp=2: both rank actors (own processes) train every step,
  their replicas end bitwise equal, the staleness bound holds and the step metrics are sane;
- a dead rank 1 is a dead trainer: the run stops naming rank 0's checkpoint, and the resume (every
  rank loads that one file) finishes the run with the replicas still equal;
- a dp that cannot share a step's GRPO groups, or dp > 1 with --in-process, is refused in one line (exit 2).

Exact parity of a dp=2 step with a dp=1 step is tests/test_runtime_parallel.py's job: two async runs
differ in engine timing, so their batches (and weights) differ whatever the trainer does.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime.records import read_metrics

PLAN = json.loads(Path("traces/data/plans/toy-cpu.json").read_text())
DP2_ONE_ENGINE = {**PLAN, "rollout": [{"gpu_type": "CPU", "tp": 1, "instances": 1}],
                  "trainer": {"gpu_type": "CPU", "dp": 2, "tp": 1, "pp": 1}}
SMALL = {"engines": 1, "staleness": 2, "prompts_per_step": 4, "group_size": 8, "dp": 2}  # 32 samples a step


def _assert_replicas_in_step(ranks: list[dict[str, Any]], steps_here: int, version: int) -> None:
    """Two rank actors, in two processes, that each trained every step and hold the same weights."""
    assert [r["rank"] for r in ranks] == [0, 1]
    assert len({r["pid"] for r in ranks}) == 2
    assert {r["steps_trained"] for r in ranks} == {steps_here}
    assert {r["version"] for r in ranks} == {version}
    assert len({r["optimizer_steps"] for r in ranks}) == 1
    assert ranks[0]["weights_sha256"] == ranks[1]["weights_sha256"]  # DDP kept the replicas bitwise equal


def test_rlfleet_run_trains_on_two_data_parallel_ranks(cli: Callable[..., Any], write: Callable[[str, str], Path],
                                                       tmp_path: Path) -> None:
    plan = write("dp2.json", json.dumps(DP2_ONE_ENGINE))
    steps = 3
    res = cli("run", str(plan), "--steps", str(steps), "--out", str(tmp_path / "run"), "--json")
    assert res.code == 0, res.err
    out = res.json()
    print(f"\ndp=2: {out['steps']} steps in {out['seconds']:.1f} s, ranks "
          f"{[(r['rank'], r['pid'], r['steps_trained']) for r in out['trainer_ranks']]}")
    assert (out["executor"], out["trainer_dp"], out["steps"], out["version"]) == ("ray-local", 2, steps, steps)
    _assert_replicas_in_step(out["trainer_ranks"], steps, steps)
    assert out["max_staleness"] <= out["staleness_bound"] == 2
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == list(range(steps))
    for row in rows:  # the global batch's statistics, as a dp=1 trainer reports them
        assert row["samples"] == 16 * 16 and 0.0 <= row["mean_reward"] <= 1.0
        assert math.isfinite(row["loss"]) and row["grad_norm"] > 0 and row["max_staleness"] <= 2


@pytest.fixture
def ray_down() -> Iterator[None]:
    """run_toy_ray leaves its local Ray running (the resume reuses it): shut it down after the test."""
    yield
    import ray

    ray.shutdown()


def test_dead_rank_1_stops_the_run_and_every_rank_resumes_from_rank_0s_checkpoint(ray_down: None,
                                                                                   tmp_path: Path) -> None:
    from runtime.ray_loop import TrainerLost
    from runtime.settings import Faults
    from runtime.toy import run_toy_ray

    steps, kill = 5, 2
    with pytest.raises(TrainerLost, match=f"during step {kill}; .* checkpoint at version {kill}"):
        run_toy_ray(steps, out_dir=tmp_path, checkpoint_every=1, faults=Faults(kill_trainer=kill,
                                                                               kill_trainer_rank=1), **SMALL)
    resumed = run_toy_ray(steps, out_dir=tmp_path, resume=True, checkpoint_every=1, **SMALL)
    print(f"\nrank 1 killed in step {kill}; resumed from {resumed.first_step}: steps {resumed.steps}, "
          f"Adam steps {resumed.optimizer_steps}, {resumed.seconds:.1f} s")
    assert resumed.first_step == kill and (resumed.steps, resumed.version) == (steps, steps)
    assert resumed.optimizer_steps == steps * 2  # both ranks took Adam's state from the checkpoint (2 minibatches)
    _assert_replicas_in_step(list(resumed.trainer_ranks), steps - kill, steps)
    assert resumed.max_staleness <= SMALL["staleness"]
    assert [r["step"] for r in read_metrics(tmp_path)] == list(range(steps))


def test_rlfleet_run_refuses_a_dp_it_cannot_split(cli: Callable[..., Any], write: Callable[[str, str], Path]) -> None:
    dp3 = write("dp3.json", json.dumps({**DP2_ONE_ENGINE, "trainer": {"gpu_type": "CPU", "dp": 3}}))
    res = cli("run", str(dp3), "--steps", "1")
    assert res.code == 2 and "dp=3" in res.err and len(res.err.strip().splitlines()) == 1
    dp2 = write("dp2.json", json.dumps(DP2_ONE_ENGINE))
    res = cli("run", str(dp2), "--steps", "1", "--in-process")
    assert res.code == 2 and "--in-process" in res.err and len(res.err.strip().splitlines()) == 1
