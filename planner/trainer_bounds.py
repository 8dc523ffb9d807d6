"""What each trainer option of the async MILP could reach at best, so the options that cannot win
are left out of its solve (issue 19: at 100,000 GPUs of 12 types the MILP has 1,118 trainer
binaries and HiGHS spends 0.75 s at its root; the options within reach of the answer are a few dozen).

For trainer option k the MILP's own rows (planner.milp) give, with w_k = z:

    z <= s_k                                      training
    z <= sigma held,  held <= in_flight           generation: no segment's slope is above sigma
    held + r T_k z <= r A                         the tail row  =>  z <= sigma r A / (1 + sigma r T_k)
    z <= sum_p rho_p (gpus_p - gpus_k on p)       each GPU the trainer leaves at its pool's best rate per GPU

and the objective, z - TIE_BREAK x cost, is at most that bound less TIE_BREAK x the trainer's own
price (the engines cost >= 0). An option whose bound is below a feasible plan's objective cannot be
the answer, nor tie with it.
"""

from __future__ import annotations

import numpy as np

from planner.candidates import Candidates

TIE_BREAK = 1e-6  # samples/s traded per $/h among plans that tie on throughput (the MILP's objective)


def objective_bounds(cand: Candidates) -> np.ndarray:
    """Per trainer option, an upper bound on the throughput objective of any async plan using it."""
    if not cand.trainers or not cand.engines:
        return np.zeros(len(cand.trainers))
    sigma = max(slope for o in cand.engines for _, slope in o.segments)
    per_gpu = np.zeros(len(cand.pools))  # a pool's best engine rate per GPU
    for o in cand.engines:
        per_gpu[o.pool] = max(per_gpu[o.pool], sum(w * s for w, s in o.segments) / o.tp)
    gpus = np.array([p.gpus for p in cand.pools], float)
    capacity = float(per_gpu @ gpus)
    r, admitted = cand.tail_ratio, cand.admitted_cap
    held = cand.in_flight_cap(0.0, 0.0)
    t = cand.trainers
    s = np.array([k.samples_per_s for k in t])
    step = np.array([k.step_seconds for k in t])
    taken = np.array([per_gpu[k.pool] * k.nodes * cand.pools[k.pool].per_node for k in t])
    price = np.array([k.price_per_hour for k in t])
    rate = np.minimum.reduce([s, np.full(len(t), sigma * held), sigma * r * admitted / (1 + sigma * r * step),
                              capacity - taken])
    return np.maximum(rate, 0.0) - TIE_BREAK * price
