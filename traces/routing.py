"""The routing policy: which engines new requests go to, over arrays of loads, capacities and keys.

Each request goes, in turn, to the accepting engine with room whose next decode iteration would be
shortest with one more request: the smallest (key[e][load + 1], e, load), where key[e][b] is the
seconds of one iteration of b mean-length requests on engine e (a least-load router, as in AReaL
and SGLang, that knows a mixed fleet's speeds, so work water-fills from the fastest engines).
Engines pulling on their own would let the first few take the whole staleness allowance.

The simulator's fast path and its token-level reference route through `Router`; so can any caller
with plain Python lists (the runtime's controller, later):

    router = Router([[0.0, 0.010, 0.011], [0.0, 0.020, 0.021]], capacities=[2, 2])
    router.route(3, accepting=[True, True], loads=[0, 1])        # -> array([0, 0, 1])
    deal(router.route(...), ids)                                 # -> [(engine, its ids), ...]

Routing many requests is one bisection and a counting sort (`water_fill`), not a heap operation per
request; a few (a completion freed a slot or two) are one argmin each (traces.routing_kernels).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from traces.routing_kernels import route_few, water_fill_kernel

FEW = 4  # up to this many free slots, one argmin per request (route_few); more, water_fill


def key_rows(tables: Sequence[Sequence[float]]) -> tuple[np.ndarray, np.ndarray]:
    """Distinct key rows (padded with inf) and each engine's row. Engines of one kind may share one
    sequence object: telling them apart by identity skips hashing hundreds of long tuples (two equal
    sequences make two equal rows: the same routing)."""
    distinct = list({id(t): t for t in tables}.values())
    width = max(len(t) for t in distinct)
    keys = np.full((len(distinct), width), np.inf)
    for r, t in enumerate(distinct):
        keys[r, :len(t)] = t
    where = {id(t): r for r, t in enumerate(distinct)}
    return keys, np.array([where[id(t)] for t in tables])


def key_table(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What `water_fill` needs of a key table, worked out once per table: the distinct finite slot
    keys (sorted), each key's rank among them (len for inf), and below[r, v]: the slots of kind r
    whose key is <= values[v] (a searchsorted per row: keys rise with load)."""
    values = np.unique(keys[:, 1:])
    values = values[np.isfinite(values)]
    rank = np.searchsorted(values, keys)
    below = np.array([np.searchsorted(k[1:], values, "right") for k in keys]).reshape(len(keys), len(values))
    return values, rank, below


def water_fill(n: int, loads: np.ndarray, caps: np.ndarray, keys: np.ndarray, row: np.ndarray,
               table: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """Engine (index into loads) of each of n requests routed in turn to the smallest
    (keys[row[e], load + 1], e, load); every engine offered has room (load < cap).

    Each engine's keys must not decrease with load: its candidate slots then come out of the
    one-at-a-time heap in sorted order, so the heap's first n picks are the n smallest candidates.
    A bisection on the key finds how many slots each engine gets; only those are sorted.
    `table` is key_table(keys), if the caller keeps it.
    """
    values, rank, below = table if table is not None else key_table(keys)
    return water_fill_kernel(n, np.asarray(loads, np.int64), np.asarray(caps, np.int64), np.asarray(row, np.int64),
                             len(values), rank, below)


def route_one_by_one(n: int, idx: np.ndarray, loads: np.ndarray, caps: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """The rule as defined, one heap operation per request (keys[r] is engine idx[r]'s row): for
    keys that fall with load somewhere, where `water_fill` does not apply."""
    heap = [(float(keys[r, loads[r] + 1]), int(idx[r]), int(loads[r]), r) for r in range(len(idx))]
    heapq.heapify(heap)
    out = []
    while len(out) < n and heap:
        _, i, load, r = heap[0]
        out.append(i)
        if load + 1 < caps[r]:
            heapq.heapreplace(heap, (float(keys[r, load + 2]), i, load + 1, r))
        else:
            heapq.heappop(heap)
    return np.array(out, dtype=np.int64)


@dataclass
class Router:
    """The routing policy over a fixed set of engines: `tables[e][b]` is engine e's key with b
    running (one decode iteration of b mean-length requests, seconds), `capacities[e]` its most."""

    tables: Sequence[Sequence[float]]
    capacities: Sequence[int]
    keys: np.ndarray = field(init=False, repr=False)  # distinct key rows, padded with inf
    row_of: np.ndarray = field(init=False, repr=False)  # each engine's row
    caps: np.ndarray = field(init=False, repr=False)
    rising: bool = field(init=False)  # every row rises with load: water_fill applies
    _table: tuple[np.ndarray, np.ndarray, np.ndarray] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.keys, self.row_of = key_rows(self.tables)
        self.caps = np.asarray(self.capacities, np.int64)
        with np.errstate(invalid="ignore"):  # rows of unequal capacity pad with inf: inf - inf is nan, not rising
            self.rising = bool(np.all(np.diff(self.keys, axis=1) >= 0))

    def route(self, n: int, accepting: Sequence[bool] | np.ndarray, loads: Sequence[int] | np.ndarray
              ) -> np.ndarray:
        """The engine of each of up to n requests, in routing order (fewer when the accepting
        engines run out of room). `loads[e]`: requests engine e holds (running or queued)."""
        accepting, loads = np.asarray(accepting, bool), np.asarray(loads, np.int64)
        if self.rising:  # a completion freed a slot or two: one argmin per request
            engine, routed = route_few(n, accepting, loads, self.caps, self.keys, self.row_of, FEW)
            if routed:
                return engine
        idx = np.flatnonzero(accepting & (loads < self.caps))
        if not len(idx):
            return idx
        loads, caps = loads[idx], self.caps[idx]
        if not self.rising:  # a key that falls with load: one at a time, as the definition says
            return route_one_by_one(n, idx, loads, caps, self.keys[self.row_of[idx]])
        if self._table is None:
            self._table = key_table(self.keys)
        return idx[water_fill(n, loads, caps, self.keys, self.row_of[idx], self._table)]


def deal(engine: np.ndarray, ids: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """Requests ids[i] routed to engine[i], grouped per engine (each in routing order), the engines
    in the order they got their first request: the order one-at-a-time sends would reach them."""
    order = np.argsort(engine, kind="stable")
    ranked, starts = np.unique(engine[order], return_index=True)
    groups = np.split(ids[order], starts[1:])
    return [(int(ranked[g]), groups[g]) for g in sorted(range(len(ranked)), key=lambda g: groups[g][0])]
