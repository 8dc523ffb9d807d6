"""Which waiting, then routed, samples join an engine's running batch now (vLLM's continuous batching).

vLLM admits preempted samples first (first in line), then routed ones in order, while the batch
has slots and each fits the KV cache with its watermark kept free (traces.capacity); the first
routed sample that does not fit waits, first in line, and the rest stay routed.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from sim.decode_plans import EMPTY, Batch
from sim.samples import Samples
from traces.capacity import admits, fits_kv, kv_room


@dataclass(slots=True)
class Admission:
    """What an engine's admission would do now: samples joining, and the queues left behind."""

    sids: np.ndarray
    waiting: deque[int]
    inbox: np.ndarray
    fresh: bool = True  # none of them was preempted (all come from the inbox)
    # the inbox's length when decided: what is routed after (an episode back from its tool call,
    # while a decided prefill is still to come) stays in line behind `inbox`
    seen: int = 0


def decide_admission(s: Samples, waiting: deque[int], inbox: np.ndarray, running: int, max_batch: int, context: float,
              kv_tokens: float) -> Admission:
    """The admission of an engine with `running` samples in its batch, KV `context`, and its queues."""
    room = kv_room(kv_tokens)
    new: list[int] = []
    if waiting:
        waiting = deque(waiting)
        while waiting and admits(running, len(new), max_batch, context,
                                 int(s.prompt[waiting[0]] + s.generated[waiting[0]]), room):  # type: ignore[arg-type]
            new.append(waiting.popleft())
    ids = np.array(new, dtype=np.int64) if new else EMPTY
    seen = len(inbox)
    if not waiting and seen == 1 and not new and running < max_batch:
        # a busy fleet's usual case, one routed sample for a freed slot: the rule below on plain numbers
        # (fits_kv's arithmetic; an empty engine always takes one)
        if running == 0 or fits_kv(context, int(s.prompt[inbox[0]]), room):
            return Admission(inbox, waiting, EMPTY, seen=1)
        return Admission(EMPTY, deque([int(inbox[0])]), EMPTY, seen=1)
    if not waiting and len(inbox):
        # routed samples in order while the batch has room and each fits; the first that does
        # not fit waits (it is first in line then), and the rest stay in the inbox
        head = inbox[:max(0, max_batch - running - len(new))]
        fits = fits_kv(context, s.prompt[head], room)  # routed samples have generated nothing yet
        if running == 0 and not new and len(head):
            fits[0] = True  # an empty engine always takes one, however long
        n = len(head) if (fits[0] if len(fits) == 1 else fits.all()) else int(np.argmin(fits))  # one: no reduction
        ids = np.concatenate((ids, head[:n])) if new else head[:n]
        if n < len(head):
            waiting = deque([int(head[n])])
            n += 1
        inbox = inbox[n:]
    return Admission(ids, waiting, inbox, fresh=not new, seen=seen)


def joined_batch(s: Samples, batch: Batch, ids: np.ndarray, fresh: bool, progress: int, context: float
           ) -> tuple[Batch, float, int]:
    """The batch, KV context and prefill tokens once `ids` have joined (`fresh`: none was preempted).
    An episode back from a tool call may hold its context in the prefix cache: not prefilled again."""
    if fresh and len(ids) == 1:  # one routed sample (a busy fleet's freed slot): plain integers, no array sums
        sid = int(ids[0])
        tokens, finish = int(s.prompt[sid]), np.array([progress + int(s.response[sid])], np.int64)
    elif fresh:  # routed samples: nothing generated yet
        tokens, finish = int(s.prompt[ids].sum()), progress + s.response[ids]
    else:
        generated = s.generated[ids]
        tokens = int(s.prompt[ids].sum() + generated.sum())
        finish = progress + s.response[ids] - generated
    now_in = np.array([progress] * len(ids), np.int64)  # np.full's wrapper costs more for the usual one or two
    out = batch.plus(ids, finish, now_in) if len(batch) else Batch(ids, finish, now_in)
    # integers all along: the sum is exact, whatever the order the reference adds them in
    return out, context + tokens, s.prefill_tokens(ids, tokens)
