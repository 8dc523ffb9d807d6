"""Figures that depend on a cost model and their arguments alone, computed once per cost model.

A request asks for the same engine curves many times: its fleet, each network tier of it, each
homogeneous baseline's fleet and each marginal value's fleet hold pools of the same GPU types, and
an engine option's curve depends on the GPU, the engine's TP and EP and the job, not on the fleet
around it (issue 19: the a100-l4 example spent 24 s of 68 in the cost model's profile-table
interpolation, the same curves for 7 fleets). The memo is kept beside the cost model (by identity,
dropped with it), so a worker forked with the request's cost model starts with what it knew.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from traces import CostModel

T = TypeVar("T")

_MEMOS: dict[int, tuple[weakref.ref[CostModel], dict[Hashable, Any]]] = {}
_LOCK = threading.RLock()  # re-entrant: a weakref callback may run (GC) while this thread holds it


def once(cm: CostModel, key: Hashable, compute: Callable[[], T]) -> T:
    """`compute()`, or what it returned the first time `key` was asked of this cost model."""
    memo = _memo(cm)
    if key not in memo:
        memo[key] = compute()  # two threads may both compute it: the same value (deterministic)
    return memo[key]  # type: ignore[no-any-return]


def _memo(cm: CostModel) -> dict[Hashable, Any]:
    with _LOCK:
        held = _MEMOS.get(id(cm))
        if held is None or held[0]() is not cm:  # none yet, or an earlier cost model's id reused
            ident = id(cm)
            held = (weakref.ref(cm, functools.partial(_forget, ident)), {})  # a partial: still callable at exit
            _MEMOS[ident] = held
        return held[1]


def _forget(ident: int, ref: weakref.ref[CostModel], memos: dict[int, Any] = _MEMOS,
            lock: Any = _LOCK) -> None:
    """Drop a dead cost model's memo (the dict and lock bound here: at exit the module's names are gone)."""
    with lock:
        if ident in memos and memos[ident][0] is ref:
            del memos[ident]
