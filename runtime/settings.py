"""The Ray run's settings: weight-sync limits, how many faults it survives, and the faults a test injects."""

from __future__ import annotations

from dataclasses import dataclass

from runtime.sync import DEFAULT_BUCKET_BYTES

# how long a sync rank waits for the others (a rendezvous, a broadcast): it bounds the stall when a rank
# dies mid-broadcast, and must exceed the slowest real broadcast (large models on slow links)
SYNC_TIMEOUT_S = 300.0
MAX_ENGINE_RESTARTS = 8  # per run: an engine that keeps dying is a bug or a bad node, not bad luck
SYNC_ATTEMPTS = 3  # rebuild-and-broadcast tries before the run gives up


@dataclass(frozen=True)
class SyncSettings:
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    timeout_s: float = SYNC_TIMEOUT_S


@dataclass(frozen=True)
class Faults:
    """Real faults injected at set points of the loop, for tests and drills (`ray.kill`, no restart).

    Each fires once. Steps count synced versions: `kill_engine=(0, 3)` kills engine 0 as soon as
    version 3 is on the engines; `kill_trainer=3` kills the trainer while it trains step 3 (which
    would make version 4).
    """

    kill_engine: tuple[int, int] | None = None  # (engine index, version)
    kill_engine_in_sync: tuple[int, int] | None = None  # (engine index, version): just before it is broadcast
    kill_trainer: int | None = None  # step
    kill_trainer_rank: int = 0  # which data-parallel rank `kill_trainer` kills
