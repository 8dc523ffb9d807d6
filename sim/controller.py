"""Admission under the staleness bound (AReaL's capacity rule) and the trained-sample buffer.

With trainer version v, batch B and bound eta, at most (eta + v + 1) B samples may ever have been
admitted. The trainer consumes samples in start-version order (never one newer than a sample still
in flight), so after v steps the untrained samples started at versions <= v - eta number at most
B: step v takes them all. No sample is dropped and no token is older than eta versions.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import numpy as np

from sim.sample import Sample


class Controller:
    def __init__(self, batch: int, eta: int, prompts: np.ndarray, responses: np.ndarray) -> None:
        self.batch = batch
        self.eta = eta
        self.version = 0
        self.admitted = 0
        self._prompts = prompts
        self._responses = responses
        self.in_flight: Counter[int] = Counter()  # start version -> samples admitted, not yet buffered
        self.buffer: list[Sample] = []
        self.on_capacity: list[Callable[[], None]] = []  # engines to wake when admission reopens
        self.on_buffer: Callable[[], None] = lambda: None  # the trainer's wake-up

    def allowance(self) -> int:
        return min((self.eta + self.version + 1) * self.batch - self.admitted, len(self._prompts) - self.admitted)

    def grant(self, wanted: int) -> list[Sample]:
        n = max(0, min(wanted, self.allowance()))
        out = [
            Sample(sid, int(self._prompts[sid]), int(self._responses[sid]), self.version)
            for sid in range(self.admitted, self.admitted + n)
        ]
        self.admitted += n
        self.in_flight[self.version] += n
        return out

    def completed(self, samples: list[Sample]) -> None:
        for s in samples:
            self.in_flight[s.start_version] -= 1
        self.buffer.extend(samples)
        self.on_buffer()

    def ready(self, step: int) -> bool:
        """B samples are buffered that are no newer than anything still in flight."""
        if len(self.buffer) < self.batch:
            return False
        self.buffer.sort(key=lambda s: (s.start_version, s.sid))
        oldest_running = min((v for v, n in self.in_flight.items() if n > 0), default=None)
        return oldest_running is None or self.buffer[self.batch - 1].start_version <= oldest_running

    def take(self) -> list[Sample]:
        batch, self.buffer = self.buffer[: self.batch], self.buffer[self.batch :]
        return batch

    def new_version(self, version: int) -> None:
        self.version = version
        for wake in self.on_capacity:
            wake()
