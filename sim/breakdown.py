"""Per-step phases of a simulated (or recorded) run, named as RL frameworks log them.

verl logs `timing_s/gen`, `timing_s/old_log_prob` (+ `timing_s/ref`), `timing_s/update_actor` and
`timing_s/step` per step; AReaL logs the same phases under its own names. The timeline's trainer
rows give them: a step's `wait` runs from the end of the previous step's weight push to the start of
its logprob pass, hand-overs aside (in sync and colocated modes that is the batch's generation,
verl's `gen`; in async mode it is what generation could not hide; a streaming trainer's waits
between its chunks add to it), then `logprob` (old policy, and
the reference's where the loss has a KL term), `train` (the PPO minibatches) and `sync` (the weight
push); colocated plans add `switch`, the two hand-overs between engines and trainer. Means are over
the steady-state steps, as throughput is (traces.records.warm_steps).
"""

from __future__ import annotations

import pandas as pd

from traces.phases import PHASES
from traces.records import warm_steps


def step_phases(timeline: pd.DataFrame) -> pd.DataFrame:
    """One row per trainer step (its weight push ends it): wait, switch, logprob, train, sync, step seconds."""
    trainer = timeline[timeline.group == "trainer"]  # a recorded run names its ranks trainer0, trainer1, ...
    first = trainer.resource.iloc[0] if len(trainer) else "trainer"
    rows = trainer[trainer.resource == first].sort_values("start", kind="stable")
    steps: list[dict[str, float]] = []
    begun, current = 0.0, {p: 0.0 for p in PHASES}
    trained_to = 0.0  # end of the step's last chunk trained so far (a streaming trainer waits between chunks)
    for activity, start, end in zip(rows.activity, rows.start, rows.end, strict=True):
        if activity == "logprob" and current["logprob"] == 0.0:
            current["wait"] = max(0.0, float(start) - begun - current["switch"])
        elif activity == "logprob":
            current["wait"] += max(0.0, float(start) - trained_to)
        if activity == "train":
            trained_to = float(end)
        if activity in current:
            current[activity] += float(end) - float(start)
        if activity == "sync":  # the push ends the step
            current["step"] = float(end) - begun
            steps.append(current)
            begun, current = float(end), {p: 0.0 for p in PHASES}
    return pd.DataFrame(steps, columns=list(PHASES))


def mean_phases(timeline: pd.DataFrame, staleness: int) -> dict[str, float]:
    """Steady-state mean seconds of each phase."""
    steps = step_phases(timeline)
    warm = warm_steps(staleness, len(steps))
    tail = steps.iloc[warm:] if len(steps) > warm else steps
    return {p: float(tail[p].mean()) if len(tail) else 0.0 for p in PHASES}
