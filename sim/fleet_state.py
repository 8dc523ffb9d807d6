"""The fleet's engine table: per engine, the state the fleet moves as arrays, and its constants.

An engine's weights version, pending update and whereabouts live here, not on the engine, so that
the fleet can stop, reload and replan hundreds of engines with a few array passes (sim.parking);
the engine reads and writes its own row through the table's methods.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

import numpy as np

from sim.decode_tables import DecodeStack, DecodeTable, PrefillCurve, stack_of
from sim.engine_groups import Loading, Parked
from traces.capacity import kv_room

# Where an engine's state lives (EngineTable.where; plain ints: the event loop compares them often)
OWN = 0  # on the engine: its own simpy process runs it
PARKED = 1  # in a sim.engine_groups.Parked, at its slot: it sleeps through its decode plan as arrays
LOADING = 2  # in a sim.engine_groups.Loading, at its slot: stopped at a push, waiting for the weights


class Resume(Enum):
    """What a parked engine's process finds when the fleet hands it back (sim.parking.Parking.unpark)."""

    INTERRUPT = "interrupt"  # its decode plan is in progress and was interrupted now: cut it
    END = "end"  # its decode plan ended now, with samples still running: commit it, then plan again
    WOKEN = "woken"  # it had no decode plan (idle), and is woken now
    END_WOKEN = "end-woken"  # its decode plan ended (now or before) draining the batch: commit it, then idle, woken


class EngineSpec(Protocol):
    """The constants of an engine the table keeps as arrays."""

    max_batch: int
    kv_tokens: float
    reward_seconds: float
    interruptible: bool
    decode: DecodeTable
    prefill: PrefillCurve


@dataclass(frozen=True)
class EngineConstants:
    """Every engine's constants as arrays (index: the engine's index in the fleet)."""

    max_batch: np.ndarray
    kv: np.ndarray  # KV cache, tokens
    room: np.ndarray  # KV tokens it may fill by admitting (traces.capacity.kv_room)
    reward: np.ndarray  # seconds from a sample's completion to its reward, into the buffer
    interruptible: np.ndarray
    stack: DecodeStack  # the engines' decode tables, stacked
    table_of: np.ndarray  # each engine's table in the stack
    one_prefill: PrefillCurve | None  # the prefill curve of every engine, when there is one kind

    @classmethod
    def of(cls, engines: Sequence[EngineSpec]) -> EngineConstants:
        kv = np.array([e.kv_tokens for e in engines], np.float64)
        stack, table_of = stack_of([e.decode for e in engines])
        one = engines[0].prefill if engines and all(e.prefill is engines[0].prefill for e in engines) else None
        return cls(np.array([e.max_batch for e in engines], np.int64), kv, kv_room(kv),  # type: ignore[arg-type]
                   np.array([e.reward_seconds for e in engines], np.float64),
                   np.array([e.interruptible for e in engines], bool), stack, table_of, one)


class EngineTable:
    """Per engine (by index): where its state lives (`where`; `home` and `slot` when the fleet holds
    it), its pending update (`update_version`, -1 for none, and `update_ready`, when the weights
    are in) and its weights' version (`version`). Arrays with room to grow: the first `n` rows count."""

    def __init__(self) -> None:
        self.n = 0
        self.where = np.zeros(0, np.int8)
        self.home = np.empty(0, object)
        self.slot = np.zeros(0, np.int64)
        self.update_version = np.zeros(0, np.int64)
        self.update_ready = np.zeros(0)
        self.version = np.zeros(0, np.int64)

    def add(self) -> int:
        """A new engine's row (its own process, version 0, no update pending): its index."""
        i = self.n
        if i == len(self.where):  # room for twice as many
            n = max(64, 2 * i)
            self.where = np.concatenate((self.where, np.full(n - i, OWN, np.int8)))
            self.home = np.concatenate((self.home, np.full(n - i, None, object)))
            grow = np.zeros(n - i, np.int64)
            self.slot, self.version = np.concatenate((self.slot, grow)), np.concatenate((self.version, grow))
            self.update_version = np.concatenate((self.update_version, np.full(n - i, -1, np.int64)))
            self.update_ready = np.concatenate((self.update_ready, np.zeros(n - i)))
        self.n += 1
        return i

    def place(self, idx: np.ndarray | list[int], where: int, home: Parked | Loading | None) -> None:
        """Engines idx (in this order: slots 0, 1, ...) now live in `home` (or their own process)."""
        self.where[idx] = where
        self.home[idx] = home
        self.slot[idx] = np.arange(len(idx))

    def held(self, i: int, where: int) -> Parked | Loading | None:
        """Engine i's Parked or Loading when the fleet holds it there (`where`), else None."""
        return self.home[i] if self.where[i] == where else None

    def has_update(self, i: int) -> bool:
        """Whether engine i has a pending weight update (`update_of` without building its tuple)."""
        return bool(self.update_version[i] >= 0)

    def update_of(self, i: int) -> tuple[int, float] | None:
        """Engine i's pending weight update: (version, time the new weights are in), or None."""
        v = self.update_version[i]
        return None if v < 0 else (int(v), float(self.update_ready[i]))

    def set_update(self, i: int, request: tuple[int, float] | None) -> None:
        if request is None:
            self.update_version[i] = -1
        else:
            self.update_version[i], self.update_ready[i] = request
