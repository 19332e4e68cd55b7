"""Retry waits: exponential, capped, and jittered so that workers that failed together (a
Redis restart) spread apart instead of retrying on the same beat."""

from __future__ import annotations

import random

import pytest

from rlfleet.shared.util.backoff import Backoff


def test_waits_double_up_to_the_cap_within_the_upper_half_of_each_step():
    backoff = Backoff(0.1, 1.0, random.Random(1))
    steps = [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    for step in steps:
        wait = backoff.next()
        assert step / 2 <= wait <= step
    backoff.reset()
    assert backoff.next() <= 0.1


def test_workers_that_fail_together_retry_apart():
    """Ten workers with their own generators: their third retries are not one beat."""
    waits = [Backoff(0.05, 2.0, random.Random(seed)) for seed in range(10)]
    thirds = []
    for b in waits:
        b.next(), b.next()
        thirds.append(b.next())
    assert len({round(w, 4) for w in thirds}) == 10
    assert max(thirds) - min(thirds) > 0.02


def test_bad_bounds_are_refused():
    with pytest.raises(ValueError, match="first_s"):
        Backoff(0.0, 1.0)
    with pytest.raises(ValueError):
        Backoff(2.0, 1.0)
