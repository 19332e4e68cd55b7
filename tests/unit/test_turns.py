"""`Turns`: roles that share one process take turns at their heavy work, on one CPU."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from rlfleet.shared.worker import ALONE, Turns, shared_cpu

from .helpers import wait_for

MULTI_CPU = sys.platform == "linux" and len(os.sched_getaffinity(0)) > 1


def in_thread(fn):
    """What `fn()` returns on a thread of its own."""
    out: list = []
    thread = threading.Thread(target=lambda: out.append(fn()))
    thread.start()
    thread.join(30)
    return out[0]


def test_one_role_at_a_time_in_the_order_they_came() -> None:
    turns, order, inside = Turns(), [], []
    first_in, release = threading.Event(), threading.Event()

    def role(name: str, hold: threading.Event | None) -> None:
        with turns:
            inside.append(name)
            assert len(inside) == 1, "two roles held a turn at once"
            order.append(name)
            first_in.set()
            if hold is not None:
                assert hold.wait(30)
            inside.remove(name)

    first = threading.Thread(target=role, args=("learner", release))
    first.start()
    assert first_in.wait(30)
    later = [threading.Thread(target=role, args=(f"collector-{i}", None)) for i in range(3)]
    for i, thread in enumerate(later):
        thread.start()  # each queues behind the one before
        wait_for(lambda n=i + 1: len(turns._queue) == n, timeout_s=30, what=f"{i + 1} queued")
    release.set()
    for thread in (first, *later):
        thread.join(30)
    assert order == ["learner", "collector-0", "collector-1", "collector-2"]


def test_a_role_alone_never_waits_and_stays_where_the_scheduler_puts_it() -> None:
    before = os.sched_getaffinity(0) if sys.platform == "linux" else None
    with ALONE, ALONE:  # not even for itself
        pass
    assert ALONE.cpu is None
    assert in_thread(lambda: (ALONE.settle(), os.sched_getaffinity(0))[1]
                     if before is not None else None) == before


@pytest.mark.skipif(not MULTI_CPU, reason="needs Linux and more than one CPU to choose from")
def test_settled_roles_share_one_cpu_and_leave_the_rest_of_the_process_alone() -> None:
    turns = Turns()
    allowed = os.sched_getaffinity(0)
    assert turns.cpu in allowed and shared_cpu() in allowed

    def settled() -> tuple[set[int], set[int]]:
        turns.settle()
        # a thread the settled role starts (its publish or report thread) inherits the CPU
        return os.sched_getaffinity(0), in_thread(lambda: os.sched_getaffinity(0))

    assert in_thread(settled) == ({turns.cpu}, {turns.cpu})
    assert in_thread(settled) == ({turns.cpu}, {turns.cpu})  # the second role: the same one
    assert os.sched_getaffinity(0) == allowed  # the caller's (the runner's) threads: as before


@pytest.mark.skipif(not MULTI_CPU, reason="needs Linux and more than one CPU to choose from")
def test_a_run_held_to_one_cpu_already_is_left_there() -> None:
    """`taskset -c 0 rlfleet single ...`: the user chose; the turns choose nothing more."""

    def made_on(cpu: int) -> tuple[int | None, set[int]]:
        os.sched_setaffinity(0, {cpu})  # this thread only
        turns = Turns()
        turns.settle()
        return turns.cpu, os.sched_getaffinity(0)

    cpu = max(os.sched_getaffinity(0))
    assert in_thread(lambda: made_on(cpu)) == (None, {cpu})
