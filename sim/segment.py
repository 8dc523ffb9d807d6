"""What an engine will do next, decided at one instant: its re-prefill, admission, prefill and decode plan."""

from __future__ import annotations

from dataclasses import dataclass

from sim.admission import Admission
from sim.decode_plans import Batch, DecodePlan, DecodeRequest


@dataclass(slots=True)
class Segment:
    """What an engine will do next, decided at one instant (see Engine.prepare)."""

    quiet: bool
    start: float
    reprefill_end: float | None  # KV re-prefill after loading weights, if any
    admission: Admission
    joined: tuple[Batch, float] | None  # batch and KV context once admitted, if any are
    prefill_end: float | None
    request: DecodeRequest | None  # the decode plan to lay out, if any
    plan: DecodePlan | None = None  # and once laid out
