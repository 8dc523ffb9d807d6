"""What each trainer option of the async MILP could reach at best, so the options that cannot win
are left out of its solve (issue 19: at 100,000 GPUs of 12 types the MILP has 1,118 trainer
binaries and HiGHS spends 0.75 s at its root; the options within reach of the answer are a few dozen).

For trainer option k the MILP's own rows (planner.milp) give, with w_k = z:

    z <= s_k                                      training
    z <= G_k(held),  held <= in_flight            generation
    held + r T_k z <= r A                         the tail row

where G_k(H) bounds the samples/s any engines on the GPUs the trainer leaves make while holding H
samples. Per pool, E_p(h) is the upper concave envelope of its options' rate per GPU at h samples
held per GPU (each option's curve is concave, planner.candidates.EngineOption; the max of them is
not, its envelope is above it); by Jensen's inequality (the perspective of a concave function grows
with the GPUs it spreads over) a pool's engines on g GPUs holding H make at most g E_p(H / g), and the
fleet's at most the best split of H over the pools: a fractional knapsack over every pool's envelope
segments, steepest first. G_k is concave and piecewise linear, so each of its segments' lines is
above it: z <= (G_j + sigma_j (r A - c_j)) / (1 + sigma_j r T_k) for every segment j (starting at
c_j samples, G_j samples/s, slope sigma_j), and z <= G_j + sigma_j (in_flight - c_j).

The objective, z - TIE_BREAK x cost, is at most that bound less TIE_BREAK x the trainer's own price
(the engines cost >= 0). An option whose bound is below a feasible plan's objective cannot be the
answer, nor tie with it.
"""

from __future__ import annotations

import itertools

import numpy as np

from planner.candidates import Candidates, EngineOption

TIE_BREAK = 1e-6  # samples/s traded per $/h among plans that tie on throughput (the MILP's objective)


def objective_bounds(cand: Candidates) -> np.ndarray:
    """Per trainer option, an upper bound on the throughput objective of any async plan using it."""
    t = cand.trainers
    if not t or not cand.engines:
        return np.zeros(len(t))
    pool, slope, width = _envelope_segments(cand)  # per GPU, steepest first across the fleet
    if not len(slope):  # no engine makes anything
        return -TIE_BREAK * np.array([k.price_per_hour for k in t])
    gpus = np.array([p.gpus for p in cand.pools], float)
    left = np.tile(gpus, (len(t), 1))  # (trainer, pool): the GPUs its engines may use
    for i, k in enumerate(t):
        left[i, k.pool] -= k.nodes * cand.pools[k.pool].per_node
    cap = np.maximum(left[:, pool], 0.0) * width  # (trainer, segment): samples each segment holds
    start = np.cumsum(cap, axis=1) - cap  # c_j
    made = np.cumsum(cap * slope, axis=1) - cap * slope  # G_j
    r, admitted, held = cand.tail_ratio, cand.admitted_cap, cand.in_flight_cap(0.0, 0.0)
    step = np.array([k.step_seconds for k in t])[:, None]
    tail = (made + slope * (r * admitted - start)) / (1 + slope * r * step)
    flat = made[:, -1] + (cap * slope)[:, -1]  # every segment full: the flat end of G
    rate = np.minimum.reduce([np.array([k.samples_per_s for k in t]), tail.min(axis=1),
                              (made + slope * (held - start)).min(axis=1), flat])
    price = np.array([k.price_per_hour for k in t])
    return np.maximum(rate, 0.0) - TIE_BREAK * price


def _envelope_segments(cand: Candidates) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every pool's envelope E_p as segments (pool, slope, samples held per GPU), sorted by slope."""
    pools, slopes, widths = [], [], []
    for p in range(len(cand.pools)):
        points = [pt for o in cand.engines if o.pool == p for pt in _per_gpu_points(o)]
        for s, w in _upper_hull(points):
            pools.append(p)
            slopes.append(s)
            widths.append(w)
    order = np.argsort(-np.array(slopes), kind="stable")
    return np.array(pools, int)[order], np.array(slopes)[order], np.array(widths)[order]


def _per_gpu_points(o: EngineOption) -> list[tuple[float, float]]:
    """The option's rate curve per GPU as (samples held, samples/s) breakpoints, from (0, 0)."""
    out, h, f = [(0.0, 0.0)], 0.0, 0.0
    for w, s in sorted(o.segments, key=lambda seg: -seg[1]):  # the MILP fills the steepest first
        h, f = h + w / o.tp, f + w * s / o.tp
        out.append((h, f))
    return out


def _upper_hull(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """(slope, width) segments of the upper concave hull of points from (0, 0), as far as it rises."""
    hull: list[tuple[float, float]] = []
    for x, y in sorted(set(points), key=lambda q: (q[0], -q[1])):
        if hull and x == hull[-1][0]:
            continue
        if hull and y <= hull[-1][1]:
            continue  # no higher than a point to its left: under the flat extension
        while len(hull) >= 2 and _cross(hull[-2], hull[-1], (x, y)) >= 0:
            hull.pop()
        hull.append((x, y))
    return [((y1 - y0) / (x1 - x0), x1 - x0) for (x0, y0), (x1, y1) in itertools.pairwise(hull)]


def _cross(a: tuple[float, float], b: tuple[float, float], c: tuple[float, float]) -> float:
    """> 0 where b lies below the line from a to c (b is not on the upper hull)."""
    return (b[0] - a[0]) * (c[1] - a[1]) - (b[1] - a[1]) * (c[0] - a[0])
