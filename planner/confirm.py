"""Confirming the plans a request reports: settling runs for the few that can still win.

Every plan a search tries is scored over a short screening window (traces.records.recommended_steps:
the warm-up and whole periods of eta + 1 steps). That window is cheap but can overstate a plan
whose cohorts finish their GRPO groups in waves longer than a period (README, "the simulated
figure's window": 17.60 samples/s screened against 10.98 settled on one MoE plan). So the answer is
confirmed lazily: the request's best by the figures it has is re-simulated as a settling run
(Search.settle_many), and again, until the best is a settled figure or the request's bounds stop it
(planner.bounds holds SETTLING_RUNS of its simulations back for these runs; they may spend the rest).
A screened figure that has not been settled never wins over a settled one it was compared with: a
plan the confirmations did not reach cannot be the answer. A fixed cap of 6 settling runs left a
better plan unsettled where several plans screened alike (0.6% better on one random fleet).
"""

from __future__ import annotations

import dataclasses

from planner.scoring import Scored, Search

CONFIRM_BATCH = 2  # settled side by side per round: fixed, so a request's answer is the same whatever its workers


def confirm(search: Search, ranked: tuple[Scored, ...], *, where: str = "the settling runs") -> tuple[Scored, ...]:
    """`ranked` with its contenders' figures settled: each round settles the request's best (by
    Search.pick over the figures known) and the next best not yet settled, until the best is
    settled or the request's bounds stop it (no simulator, or settling off: `ranked` as it is). Plans
    of the same placement share one settling run."""
    out = list(ranked)
    if not search.settle:
        return ranked
    while not search.pick(out).confirmed:
        pending = [i for i, s in sorted(enumerate(out), key=lambda e: search.preference(e[1]))
                   if not s.confirmed and s.job is not None]
        batch = pending[:CONFIRM_BATCH]
        settled = {s.job.key(): s.simulated for s in search.settle_many([out[i] for i in batch], where=where)
                   if s.confirmed and s.job is not None}
        if not settled:  # nothing left to settle, or the request's clock stopped it
            break
        out = [dataclasses.replace(s, simulated=settled[s.job.key()], screened=s.simulated)
               if not s.confirmed and s.job is not None and s.job.key() in settled else s for s in out]
    return tuple(out)


def best_confirmed(search: Search, ranked: tuple[Scored, ...] | list[Scored]) -> Scored:
    """The request's pick among its settled plans (all of them when none is settled)."""
    settled = [s for s in ranked if s.confirmed]
    return search.pick(settled or list(ranked))


def unsettled_note(search: Search, ranked: tuple[Scored, ...], chosen: Scored) -> str | None:
    """One line when plans screened above the answer's settled figure were left unsettled (the
    request's bound of simulations or its clock): the answer is the best confirmed, not the best."""
    if not chosen.confirmed:
        return None
    ahead = {s.job.key() for s in ranked
             if not s.confirmed and s.job is not None and search.preference(s) < search.preference(chosen)}
    if not ahead:
        return None
    over = [s.screened.samples_per_s / s.samples_per_s for s in ranked
            if s.confirmed and s.screened is not None and s.samples_per_s > 0]
    told = f"; settled plans screened at {min(over):.2f}-{max(over):.2f}x their settled figures" if over else ""
    return (f"{len(ahead)} plan(s) screened above the answer's settled {chosen.samples_per_s:.2f} samples/s were not "
            f"settled (the request's bounds: --max-simulations, --max-seconds){told}")
