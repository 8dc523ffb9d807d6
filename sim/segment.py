"""What an engine will do next, decided at one instant: its re-prefill, admission, prefill and decode
plan to lay out (`prepare`)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import simpy

from sim.admission import Admission, decide_admission, joined_batch
from sim.decode_plans import EMPTY, Batch, DecodePlan, DecodeRequest
from sim.decode_tables import DecodeTable, PrefillCurve
from sim.samples import Samples


@dataclass(slots=True)
class Segment:
    """What an engine will do next, decided at one instant (see `prepare`)."""

    quiet: bool
    start: float
    reprefill_end: float | None  # KV re-prefill after loading weights, if any
    admission: Admission
    joined: tuple[Batch, float] | None  # batch and KV context once admitted, if any are
    prefill_end: float | None
    request: DecodeRequest | None  # the decode plan to lay out, if any
    plan: DecodePlan | None = None  # and once laid out

class EngineView(Protocol):
    """What deciding a segment reads of an engine (sim.engine.Engine)."""

    env: simpy.Environment
    samples: Samples
    decode: DecodeTable
    prefill: PrefillCurve
    max_batch: int
    kv_tokens: float
    batch: Batch
    waiting: deque[int]
    inbox: np.ndarray
    progress: int
    context: float

    @property
    def update(self) -> tuple[int, float] | None: ...
    def quiet(self) -> bool: ...


def prepare(e: EngineView, reprefill: bool) -> Segment:
    """Engine e's KV re-prefill, admission and prefill, then decode: as far as it can see now.

    When quiet, all of it is decided now (and the decode plan's completions filed at once).
    Otherwise only the first of them: then the loop looks again (new requests or an update may
    be waiting by then).
    """
    quiet = e.quiet()
    t = now = e.env.now
    reprefill_end = None
    if reprefill:
        reprefill_end = t = t + e.prefill(e.context)
    # nothing to admit: `_admission`'s first case, without its reads
    admission = Admission(EMPTY, e.waiting, e.inbox) if not (e.waiting or len(e.inbox)) else _admission(e)
    now_joined, prefill_end = None, None
    if len(admission.sids) and (quiet or not reprefill):
        batch, context, tokens = joined_batch(e.samples, e.batch, admission.sids, admission.fresh, e.progress,
                                              e.context)
        now_joined = (batch, context)
        prefill_end = t = t + e.prefill(tokens)
    else:
        batch, context = e.batch, e.context
    request = None
    if len(batch) and (quiet or not (reprefill or len(admission.sids))):
        # after a completion the engine would admit what waits, or what new requests bring
        stop = not quiet or bool(admission.waiting) or len(admission.inbox) > 0
        request = DecodeRequest(batch, e.progress, context, t, e.kv_tokens, e.decode, stop)
    return Segment(quiet, now, reprefill_end, admission, now_joined, prefill_end, request)


def prepare_routed(e: EngineView, reprefill: bool, new: Batch, tokens: int, prefill_tokens: int) -> Segment:
    """`prepare` when quiet with nothing preempted waiting, and `new` (the inbox's head) all fits
    (sim.fleet works that out for many engines at once): `tokens` of context join, `prefill_tokens`
    of them prefilled (the rest in the prefix cache)."""
    now = e.env.now
    reprefill_end = now + e.prefill(e.context) if reprefill else None
    context = e.context + tokens
    prefill_end = t = (now if reprefill_end is None else reprefill_end) + e.prefill(prefill_tokens)
    inbox = e.inbox[len(new):]
    admission = Admission(new.sid, e.waiting, inbox, seen=len(e.inbox))
    joined = (new, context)  # Fleet puts the whole batch, as the decode plan sorted it, in here
    request = DecodeRequest(e.batch, e.progress, context, t, e.kv_tokens, e.decode, len(inbox) > 0, new)
    return Segment(True, now, reprefill_end, admission, joined, prefill_end, request)


def _admission(e: EngineView) -> Admission:
    """Which waiting, then routed, samples join the batch now (sim.admission)."""
    if e.update is not None or not (e.waiting or len(e.inbox)):  # a draining engine admits nothing
        return Admission(EMPTY, e.waiting, e.inbox, seen=len(e.inbox))
    return decide_admission(e.samples, e.waiting, e.inbox, len(e.batch), e.max_batch, e.context, e.kv_tokens)
