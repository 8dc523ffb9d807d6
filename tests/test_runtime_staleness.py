"""The runtime's capacity rule and staleness-safe batch selection, driven by random completion orders."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from traces.staleness import CapacityController


def drive(batch: int, eta: int, steps: int, seed: int, slots: int) -> list[tuple[int, int]]:
    """Admit as allowed, complete in random order, train when ready; returns (step, start version) per unit.

    `slots` bounds units in flight (the engines' capacity), so some runs are starved and others
    have the whole allowance in flight.
    """
    rng = random.Random(seed)
    ctl: CapacityController[int] = CapacityController(batch, eta)
    in_flight: list[tuple[int, int]] = []
    trained: list[tuple[int, int]] = []
    step = 0
    for _ in range(100_000):
        if step == steps:
            return trained
        assert ctl.admitted <= (eta + ctl.version + 1) * batch
        while ctl.allowance() > 0 and len(in_flight) < slots:
            in_flight.append(ctl.admit())
            assert ctl.admitted <= (eta + ctl.version + 1) * batch
        for _ in range(rng.randint(0, len(in_flight))):  # any subset completes, in any order
            uid, start = in_flight.pop(rng.randrange(len(in_flight)))
            ctl.complete(uid, start, uid)
        if ctl.ready(step):
            taken = ctl.take()
            assert len(taken) == batch
            trained.extend((step, a.start_version) for a in taken)
            step += 1
            ctl.new_version(step)
    raise AssertionError("the selection never became ready: the rule can stall")


@settings(max_examples=60, deadline=None)
@given(batch=st.integers(1, 6), eta=st.integers(0, 3), seed=st.integers(0, 10_000), slots_factor=st.integers(1, 4))
def test_selection_never_trains_beyond_eta_and_never_stalls(batch: int, eta: int, seed: int,
                                                            slots_factor: int) -> None:
    steps = 12
    trained = drive(batch, eta, steps, seed, slots=batch * slots_factor)
    assert len(trained) == steps * batch
    assert max(step - start for step, start in trained) <= eta
    assert all(start <= step for step, start in trained)


def test_capacity_is_eta_plus_version_plus_one_batches() -> None:
    ctl: CapacityController[int] = CapacityController(batch=4, eta=2)
    assert ctl.allowance() == 12  # (2 + 0 + 1) * 4
    for _ in range(12):
        ctl.admit()
    with pytest.raises(RuntimeError):
        ctl.admit()
    ctl.new_version(1)
    assert ctl.allowance() == 4


def test_step_waits_for_an_old_sample_it_must_train() -> None:
    """eta = 1: step 1 must train every version-0 sample, so it waits for a late one rather than take a newer."""
    ctl: CapacityController[int] = CapacityController(batch=2, eta=1)
    a, b, c, d = (ctl.admit() for _ in range(4))  # all at version 0: 2 batches, allowed by eta = 1
    for uid, start in (a, b):
        ctl.complete(uid, start, uid)
    assert ctl.ready(0)
    ctl.take()
    ctl.new_version(1)
    e, f = ctl.admit(), ctl.admit()  # version 1
    for uid, start in (e, f, c):
        ctl.complete(uid, start, uid)
    # the two oldest are c (v0) and e (v1); d (v0) would then be 2 versions old at step 2: not ready
    assert not ctl.ready(1)
    ctl.complete(*d, d[0])
    assert ctl.ready(1)
    assert sorted(x.start_version for x in ctl.take()) == [0, 0]
