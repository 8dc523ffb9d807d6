"""Admission under the staleness bound (AReaL's capacity rule) and the trained-sample buffer.

With trainer version v, batch B and bound eta, at most (eta + v + 1) B samples may ever have been
admitted. Step s must train every sample started at a version <= s - eta (its oldest token would
otherwise exceed the bound), so before taking the B oldest buffered samples the trainer checks that
each later step can still do so: for every start version L in (s - eta, s], the samples started at
<= L left untrained must fit the L + eta - s steps that remain for them. By induction over steps
this is always reachable by waiting for completions: no sample is dropped, none is trained twice,
and no token is older than eta versions.
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
        """Step `step` may train the B oldest buffered samples without breaking the bound later."""
        if len(self.buffer) < self.batch:
            return False
        self.buffer.sort(key=lambda s: (s.start_version, s.sid))
        untrained: Counter[int] = Counter(self.in_flight)
        for s in self.buffer[self.batch :]:
            untrained[s.start_version] += 1
        left = 0
        for level in range(min((v for v, n in untrained.items() if n > 0), default=step), step + 1):
            left += untrained.get(level, 0)
            if left > max(0, level + self.eta - step) * self.batch:
                return False
        return True

    def take(self) -> list[Sample]:
        batch, self.buffer = self.buffer[: self.batch], self.buffer[self.batch :]
        return batch

    def new_version(self, version: int) -> None:
        self.version = version
        for wake in self.on_capacity:
            wake()
