"""The run-record format: what a runtime run leaves in its folder, read back for comparison.

A run folder holds:
- `metrics.jsonl`: one JSON object per trained step (`step`, `samples`, `time` = seconds from the
  run's start when the step's weights were synced, reward and loss figures, `staleness_tokens`,
  and the trained batch's `prompt_lengths` / `response_lengths` histograms);
- `timeline.csv`: intervals in the simulator's columns (TIMELINE_COLUMNS), seconds from the start;
  an agentic run's tool calls are rows of resource TOOL_RESOURCE, activity TOOL_ACTIVITY, one sample each;
- `tool_calls.csv` (agentic runs): each tool call's sample id, turn, start, end (seconds from the start),
  the latency it slept and the weights' version it left at (TOOL_CALL_COLUMNS);
- `plan.json`, `workload.yaml`, `cluster.yaml`: what ran, as the simulator reads them: the plan
  executed, the job with the length mix actually observed, and the machines;
- `placement.json` (Ray runs): the mode, engine kind, whether bundles were pinned to the plan's
  nodes, each plan group's actors, and every actor's Ray node with its GPU-type label and node index;
- `run.json` (`rlfleet run`): the run's summary as `--json` prints it (mode, batch, reward, staleness,
  samples trained and re-generated, placement, the plan settings not applied, the prediction);
- `phases.json` (Ray runs): per plan group and phase, the busy seconds, intervals and mean interval
  (`group_phases` of the timeline, the function fidelity applies to a simulation as well).
So a prediction of the same run is one `sim.simulate` call away (sim.fidelity does it).
"""

from __future__ import annotations

import io
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from traces.cluster import Cluster, load_cluster
from traces.errors import SpecError
from traces.io import atomic_write_text, loads_json, read_user_text
from traces.lengths import LengthDist
from traces.models import ModelSpec
from traces.plan import Plan, load_plan
from traces.staleness import lag_bound
from traces.workload import Workload, load_workload

TIMELINE_COLUMNS = ("resource", "group", "activity", "start", "end", "version", "samples")
TOOL_RESOURCE, TOOL_GROUP, TOOL_ACTIVITY = "tools", "environment", "tool_call"
TOOL_CALL_COLUMNS = ("sample", "turn", "start", "end", "latency", "version")
TOOL_CALLS_FILE = "tool_calls.csv"
METRICS_FILE = "metrics.jsonl"
TIMELINE_FILE = "timeline.csv"
PLAN_FILE = "plan.json"
WORKLOAD_FILE = "workload.yaml"
CLUSTER_FILE = "cluster.yaml"
PLACEMENT_FILE = "placement.json"
PHASES_FILE = "phases.json"
RUN_FILE = "run.json"
MAX_RECORD_BYTES = 512 * 1024**2  # a long run's metrics and timeline; the cap only stops a wrong file


def period(staleness: float) -> int:
    """Steps between the long tails of cohorts admitted together under AReaL's rule: eta + 1."""
    return lag_bound(staleness) + 1


def warm_steps(staleness: float, steps: int) -> int:
    """Steps before the steady state: the first staleness + 1 (at most half the run).

    AReaL's rule admits (eta + 1) batches at version 0 at once, and step eta must train all of
    them, long tail included: those steps are a start-up transient. The simulator and a measured
    run skip the same steps, so their throughputs compare like for like.
    """
    return min(period(staleness), steps // 2) if steps >= 2 else 0


def recommended_steps(staleness: float) -> int:
    """Trainer steps for a short run to measure its steady state: the warm-up plus whole periods.

    Under AReaL's rule the long tail of each cohort admitted together lands once every eta + 1
    steps (a slow step among fast ones), so a window holding part of a period over- or under-states
    the rate (at eta 4, 8 steps measured 42 samples/s where 24 steps measured 66). Warm-up eta + 1,
    then whole periods: one, or as many as make about 8 steps in all.
    """
    every = period(staleness)
    return every * (1 + max(1, -(-8 // every) - 1))


SETTLE_TOLERANCE = 0.03  # the steady rate moved less than this over the last period: settled
SETTLE_MIN_PERIODS = 3  # whole periods after the warm-up before a run may count as settled
SETTLE_MIN_STEPS = 8  # and at least this many steps after it (a sync run's period is one step)
SETTLE_STEPS = 48  # steps after the warm-up a settling run simulates at most (settle_cap)


def settle_cap(staleness: float) -> int:
    """The most steps a settling run simulates: the warm-up and whole periods making >= SETTLE_STEPS.

    The cohorts a run admits together can finish their GRPO groups in waves longer than one period
    (README, "the simulated figure's window")."""
    every = period(staleness)
    return every * (1 + max(SETTLE_MIN_PERIODS, -(-SETTLE_STEPS // every)))


def settled(step_ends: Sequence[float], step_samples: Sequence[int], staleness: float,
            tolerance: float = SETTLE_TOLERANCE) -> bool:
    """Whether a run's steady rate (`steady_state`) has settled: at a period boundary after at least
    SETTLE_MIN_PERIODS periods and SETTLE_MIN_STEPS steps past the warm-up, the rate over all of them
    within `tolerance` of the rate without the last period."""
    every = period(staleness)
    steps = len(step_ends)
    past = steps - every  # the warm-up is one period (warm_steps, once the run is 2 periods long)
    if past < max(SETTLE_MIN_PERIODS * every, SETTLE_MIN_STEPS) or past % every:
        return False
    rates = []
    for end in (steps - every, steps):
        samples, seconds = steady_state(step_ends[:end], step_samples[:end], staleness)
        rates.append(samples / seconds if seconds > 0 else 0.0)
    before, now = rates
    return before > 0 and abs(now / before - 1.0) <= tolerance


def steady_state(step_ends: Sequence[float], step_samples: Sequence[int], staleness: float) -> tuple[int, float]:
    """(samples, seconds) trained after the warm-up steps (`warm_steps`)."""
    steps = len(step_ends)
    warm = warm_steps(staleness, steps)
    t0 = step_ends[warm - 1] if warm else 0.0
    return sum(step_samples[warm:]), (step_ends[-1] - t0) if steps else 0.0


def length_histogram(lengths: Sequence[int]) -> dict[str, int]:
    """{length: count} with string keys, as JSON writes them."""
    return {str(k): v for k, v in sorted(Counter(lengths).items())}


def observed_lengths(metrics: Sequence[Mapping[str, Any]], key: str) -> tuple[list[int], list[int]]:
    """Sum a per-step length histogram over the run: (lengths, counts) for an empirical LengthDist."""
    total: Counter[int] = Counter()
    for row in metrics:
        for length, count in row.get(key, {}).items():
            total[int(length)] += int(count)
    if not total:
        raise SpecError(f"the run's metrics carry no {key}: record it again with this version of rlfleet run")
    lengths = sorted(total)
    return lengths, [total[n] for n in lengths]


def observed_workload(name: str, model: ModelSpec, plan: Plan, metrics: Sequence[Mapping[str, Any]], *,
                      prompts_per_step: int, group_size: int, ppo_minibatches: int) -> Workload:
    """The job a run executed, with the prompt and response lengths it actually trained on."""
    prompts, prompt_counts = observed_lengths(metrics, "prompt_lengths")
    responses, response_counts = observed_lengths(metrics, "response_lengths")
    return Workload(
        name=name, model=model, prompts_per_step=prompts_per_step, group_size=group_size,
        prompt_len=LengthDist(kind="empirical", lengths=prompts, counts=prompt_counts),
        response_len=LengthDist(kind="empirical", lengths=responses, counts=response_counts),
        mode=plan.mode, staleness=plan.staleness, ppo_minibatches=ppo_minibatches,
    )


def write_run_spec(folder: str | os.PathLike[str], plan: Plan, workload: Workload, cluster: Cluster) -> None:
    """plan.json, workload.yaml and cluster.yaml of a run, each written atomically."""
    out = Path(folder)
    atomic_write_text(out / PLAN_FILE, plan.to_json())
    atomic_write_text(out / WORKLOAD_FILE, yaml.safe_dump(workload.model_dump(mode="json"), sort_keys=False))
    atomic_write_text(out / CLUSTER_FILE, yaml.safe_dump(cluster.model_dump(mode="json"), sort_keys=False))


def rollout_key(index: int) -> str:
    """The name a plan's rollout group `index` goes by in records and reports."""
    return f"rollout{index}"


TRAINER_KEY = "trainer"


def group_phases(timeline: pd.DataFrame, group_of: Mapping[str, str]) -> dict[str, dict[str, dict[str, float]]]:
    """{group: {phase: {"seconds", "intervals", "mean_s"}}} of a timeline whose resources `group_of`
    maps to plan groups (resources it does not name are left out)."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    if timeline.empty:
        return out
    rows = timeline.assign(_group=timeline["resource"].map(group_of), _s=timeline["end"] - timeline["start"])
    for (group, phase), part in rows.dropna(subset=["_group"]).groupby(["_group", "activity"], sort=True):
        out.setdefault(str(group), {})[str(phase)] = {"seconds": round(float(part["_s"].sum()), 6),
                                                      "intervals": len(part),
                                                      "mean_s": round(float(part["_s"].mean()), 6)}
    return out


@dataclass(frozen=True)
class RunRecord:
    folder: Path
    metrics: tuple[dict[str, Any], ...]
    timeline: pd.DataFrame
    plan: Plan
    workload: Workload
    cluster: Cluster
    placement: dict[str, Any] | None = None  # placement.json (Ray runs), or None

    def group_of(self) -> dict[str, str]:
        """Timeline resource -> plan group (rollout_key / TRAINER_KEY), from the placement record."""
        if self.placement is None:
            return {}
        return {str(a["name"]): str(a["group"]) for a in self.placement["actors"]}

    @property
    def steps(self) -> int:
        return len(self.metrics)

    def samples_per_s(self) -> float:
        """Trained samples per second over the steady-state window (see `steady_state`)."""
        samples, seconds = steady_state([float(m["time"]) for m in self.metrics],
                                        [int(m["samples"]) for m in self.metrics], self.plan.staleness)
        return samples / seconds if seconds > 0 else 0.0


def read_metrics(folder: str | os.PathLike[str]) -> list[dict[str, Any]]:
    path = Path(folder) / METRICS_FILE
    if not os.path.lexists(path):
        raise SpecError(f"{path}: no metrics; is {folder} the --out folder of an rlfleet run?")
    lines = read_user_text(path, MAX_RECORD_BYTES).splitlines()
    rows = [loads_json(line, f"{path}:{n}") for n, line in enumerate(lines, 1) if line]
    if not all(isinstance(row, dict) for row in rows):
        raise SpecError(f"{path}: every line must be one JSON object (a step's metrics)")
    return rows


def read_run(folder: str | os.PathLike[str]) -> RunRecord:
    """A run folder, checked: a missing file is named with what writes it."""
    root = Path(folder)
    if not root.is_dir():
        raise SpecError(f"{root}: no such run folder (give the --out folder of an rlfleet run)")
    for name in (PLAN_FILE, WORKLOAD_FILE, CLUSTER_FILE, TIMELINE_FILE):
        if not (root / name).is_file():
            raise SpecError(f"{root / name}: missing; a run folder from `rlfleet run --out` has it")
    metrics = read_metrics(root)
    if not metrics:
        raise SpecError(f"{root / METRICS_FILE}: no step was recorded")
    try:
        timeline = pd.read_csv(io.StringIO(read_user_text(root / TIMELINE_FILE, MAX_RECORD_BYTES)))
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise SpecError(f"{root / TIMELINE_FILE}: not a timeline CSV ({str(exc).splitlines()[0]})") from None
    placement = None
    if (root / PLACEMENT_FILE).is_file():
        placement = loads_json(read_user_text(root / PLACEMENT_FILE, MAX_RECORD_BYTES), str(root / PLACEMENT_FILE))
        if not isinstance(placement, dict) or not isinstance(placement.get("actors"), list):
            raise SpecError(f"{root / PLACEMENT_FILE}: not a placement record (an object with an actors list)")
    return RunRecord(root, tuple(metrics), timeline, load_plan(root / PLAN_FILE),
                     load_workload(root / WORKLOAD_FILE), load_cluster(root / CLUSTER_FILE), placement)
