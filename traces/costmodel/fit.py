"""Fit the roofline's efficiency factors to measured cases, and judge them leave-one-source-out.

A case is one measurement (a calibration row, or a phase of a user's logged run) with a function
that predicts it from a cost model. The fit minimises a robust (soft-L1) loss of the log error
log(predicted / measured) over the chosen Efficiency fields, in log space within each field's
bounds (scipy.optimize.least_squares, trust-region reflective). An optional prior pulls each field
towards its start (one more residual per field, `prior_weight` x log(value / start): a Gaussian prior
in log space, i.e. ridge regression), so that a field few rows constrain, or two fields that trade
against each other (train_matmul and train_half_tokens), stay near a sensible value instead of
running to a bound (a field off by default is not held). An error is only known on data the fit
did not see: `leave_one_source_out` refits without each source in turn and predicts it. A case
that is an upper bound (Case.bound) costs nothing while the prediction stays below it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from traces.costmodel.efficiency import DEFAULT_EFFICIENCY, Efficiency
from traces.costmodel.model import CostModel
from traces.costmodel.tables import ProfileTable
from traces.errors import SpecError

# What may be fitted, and within which physical bounds (fractions stay fractions; overheads and
# latencies between a microsecond-scale floor and what no published engine shows).
BOUNDS: dict[str, tuple[float, float]] = {
    "matmul": (0.2, 1.0),
    "memory": (0.3, 0.95),
    "decode_overhead_s": (1e-4, 0.02),
    "decode_overhead_per_seq_s": (1e-7, 1e-4),
    "graph_loop_decode_overhead_s": (1e-4, 0.02),
    "prefill_overhead_s": (1e-4, 0.05),
    "train_matmul": (0.2, 1.0),
    "expert_matmul": (0.05, 1.0),
    "train_half_tokens": (1.0, 16384.0),
    "moe_layer_overhead_s": (1e-6, 5e-3),
    "roofline_p": (1.0, 64.0),  # the sum .. (nearly) the larger of compute and memory
    "comm_overlap": (0.01, 0.99),  # log-space fit: a floor above 0
    "collective_latency_s": (1e-6, 1e-3),
    "sync_fixed_s": (1e-3, 1.0),
    "sync_per_tensor_s": (1e-6, 5e-3),
}


@dataclass(frozen=True)
class Case:
    """One measured figure and how the cost model predicts it (same unit)."""

    id: str
    source: str  # cases of one source are left out together
    kind: str
    measured: float
    predict: Callable[[CostModel], float] = field(repr=False, compare=False)
    fitted: bool = True  # False: judged only (e.g. RL steps, too costly to simulate inside a fit)
    # "upper": the measured figure bounds the prediction from above (e.g. the last first-token time of
    # prompts sent together bounds their prefill): a prediction at or below it is no error, one above
    # misses by how far it exceeds it. "": a point measurement.
    bound: str = ""

    def __post_init__(self) -> None:
        if self.bound not in ("", "upper"):
            raise SpecError(f"case {self.id}: bound {self.bound!r} is not known; use 'upper' or leave it empty")

    def error(self, cm: CostModel) -> float:
        """Signed relative error of the prediction: predicted / measured - 1."""
        return self.predict(cm) / self.measured - 1.0

    def miss(self, predicted: float) -> float:
        """How far `predicted` misses: the signed relative error, or for a bound how far it crosses it (0 inside)."""
        err = predicted / self.measured - 1.0
        return max(err, 0.0) if self.bound == "upper" else err


def _model(eff: Efficiency, tables: ProfileTable | None) -> CostModel:
    return CostModel(tables if tables is not None else ProfileTable.empty(), eff)


def fit(cases: Sequence[Case], fields: Iterable[str], *, start: Efficiency = DEFAULT_EFFICIENCY,
        tables: ProfileTable | None = None, max_evals: int = 400,
        bounds: Mapping[str, tuple[float, float]] = BOUNDS, prior_weight: float = 0.0) -> Efficiency:
    """The Efficiency whose `fields` best predict the fitted `cases` (others kept from `start`);
    `prior_weight` > 0 adds the log-space prior towards `start` (module docstring)."""
    from scipy.optimize import least_squares

    names = list(fields)
    unknown = [n for n in names if n not in bounds]
    if unknown:
        raise SpecError(f"cannot fit {', '.join(unknown)}: fittable fields are {', '.join(bounds)}")
    used = [c for c in cases if c.fitted]
    if not used:
        raise SpecError("nothing to fit: no case is marked fitted")
    lo = np.log([bounds[n][0] for n in names])
    hi = np.log([bounds[n][1] for n in names])
    # A field off by default (e.g. train_half_tokens = 0) has no start of its own (log 0): it starts
    # midway (in log space) between its bounds, not on the lower one, where its gradient vanishes
    # (mb / (mb + 1) is flat) and the trust region never leaves it.
    off = np.array([float(getattr(start, n)) < bounds[n][0] for n in names])
    x0 = np.clip(np.log([max(float(getattr(start, n)), bounds[n][0]) for n in names]), lo + 1e-9, hi - 1e-9)
    x0 = np.where(off, (lo + hi) / 2, x0)

    def efficiency(x: np.ndarray) -> Efficiency:
        return replace(start, **{n: float(math.exp(v)) for n, v in zip(names, x, strict=True)})

    # The prior holds only fields that start at a value (one off by default, e.g. train_half_tokens =
    # 0, has no value to be held to).
    prior_at = np.log([max(float(getattr(start, n)), bounds[n][0]) for n in names])
    held = ~off

    def residuals(x: np.ndarray) -> np.ndarray:
        cm = _model(efficiency(x), tables)
        logs = [math.log(max(c.predict(cm), 1e-30) / c.measured) for c in used]
        data = np.array([max(v, 0.0) if c.bound == "upper" else v for c, v in zip(used, logs, strict=True)])
        return np.concatenate([data, prior_weight * (x - prior_at)[held]]) if prior_weight > 0 else data

    found = least_squares(residuals, x0, bounds=(lo, hi), loss="soft_l1", f_scale=0.1, max_nfev=max_evals,
                          diff_step=1e-3)
    return efficiency(found.x)


def _constrained(cases: Sequence[Case], names: Sequence[str], start: Efficiency,
                 tables: ProfileTable | None) -> list[str]:
    """The fields some fitted case responds to. The others stay at `start`: a bounded fit moves a
    field no residual depends on off its start (least_squares' trust region steps off the bounds), so a
    held-out source's only field (e.g. expert_matmul without the MoE training rows) would drift."""
    used = [c for c in cases if c.fitted]
    if not used:
        return []
    base = [c.predict(_model(start, tables)) for c in used]
    out = []
    for n in names:
        v = max(float(getattr(start, n)), BOUNDS.get(n, (1e-12, 1.0))[0])
        probe = _model(replace(start, **{n: v * 0.9}), tables)
        if any(not math.isclose(c.predict(probe), b, rel_tol=1e-9) for c, b in zip(used, base, strict=True)):
            out.append(n)
    return out


@dataclass(frozen=True)
class Judged:
    """A case's error (Case.miss: 0 inside a bound) under the fit on everything, and under the fit
    without its source."""

    case: Case
    predicted: float
    error: float
    held_out_predicted: float
    held_out_error: float


def leave_one_source_out(cases: Sequence[Case], fields: Iterable[str], *, start: Efficiency = DEFAULT_EFFICIENCY,
                         tables: ProfileTable | None = None,
                         progress: Callable[[str], None] | None = None,
                         prior_weight: float = 0.0) -> tuple[Efficiency, list[Judged]]:
    """Fit on all cases, then once per source without it; every case judged both ways."""
    names = list(fields)
    full = fit(cases, names, start=start, tables=tables, prior_weight=prior_weight)
    cm_full = _model(full, tables)
    judged: list[Judged] = []
    for source in sorted({c.source for c in cases}):
        if progress is not None:
            progress(source)
        mine = [c for c in cases if c.source == source]
        rest = [c for c in cases if c.source != source]
        free = _constrained(rest, names, start, tables)
        held = fit(rest, free, start=start, tables=tables, prior_weight=prior_weight) if free else start
        cm_held = _model(held, tables)
        for c in mine:
            p, q = c.predict(cm_full), c.predict(cm_held)
            judged.append(Judged(c, p, c.miss(p), q, c.miss(q)))
    order = {c.id: i for i, c in enumerate(cases)}
    judged.sort(key=lambda j: order[j.case.id])
    return full, judged


def summary(errors: Sequence[float]) -> dict[str, float]:
    """Median and worst absolute error, and the signed median (a one-sided bias shows here)."""
    e = np.asarray(errors, float)
    return {"median_abs": float(np.median(np.abs(e))), "worst_abs": float(np.max(np.abs(e))),
            "signed_median": float(np.median(e)), "n": float(len(e))}
