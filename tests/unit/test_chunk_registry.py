"""The chunk registry remembers released ids for a while, so a collector's late retry of a
report cannot index a chunk whose bytes are gone; the memory of them is bounded by time and by
count, so it stops growing minutes into a run."""

from __future__ import annotations

from rlfleet.shared.replay.buffers import ChunkRegistry


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_released_ids_are_remembered_for_the_window_then_forgotten():
    clock = Clock()
    reg = ChunkRegistry(remember_released=1000, remember_s=60.0, clock=clock)
    reg.hold("a", 2)
    assert reg.release(["a"]) == [] and "a" in reg  # one buffer still refers to it
    assert reg.release(["a"]) == ["a"] and "a" not in reg and reg.seen("a")
    clock.now = 59.0
    reg.hold("b", 1)
    reg.release(["b"])
    assert reg.seen("a") and reg.seen("b")
    clock.now = 61.0
    reg.hold("c", 1)
    reg.release(["c"])
    assert not reg.seen("a"), "released more than remember_s ago"
    assert reg.seen("b") and reg.seen("c") and reg.remembered() == 2


def test_the_count_caps_the_window_of_a_fast_run():
    clock = Clock()
    reg = ChunkRegistry(remember_released=100, remember_s=600.0, clock=clock)
    for i in range(1000):
        clock.now = i * 0.01
        reg.hold(str(i), 1)
        reg.release([str(i)])
    assert reg.remembered() == 100
    assert reg.seen("999") and reg.seen("900") and not reg.seen("899")
