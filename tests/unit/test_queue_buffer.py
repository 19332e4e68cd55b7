"""shared/replay/buffers/queue.py (QueueBuffer): whole chunks, FIFO, each handed out once."""

from __future__ import annotations

import threading
import time
from collections import Counter

import numpy as np
import pytest

from rlfleet.shared.contract.codec import decode_arrays, encode_arrays
from rlfleet.shared.replay.buffers.base import ChunkInfo, SampleError
from rlfleet.shared.replay.buffers.queue import QueueBuffer


def chunk(chunk_id: str, length: int = 10, version: int = 0) -> ChunkInfo:
    return ChunkInfo(chunk_id, length, version)


def take(buf: QueueBuffer, n: int, policy_version: int = 0, train_iteration: int = 0) -> list[str]:
    return buf.sample(1, n, train_iteration, policy_version).chunk_ids


# -- construction -------------------------------------------------------------------------

def test_bad_arguments():
    with pytest.raises(ValueError, match="capacity=0"):
        QueueBuffer("queue", 0, seed=0)
    with pytest.raises(ValueError, match="max_policy_lag=-1"):
        QueueBuffer("queue", 10, seed=0, max_policy_lag=-1)
    buf = QueueBuffer("queue", 10, seed=0)
    with pytest.raises(SampleError, match="num_batches=0"):
        buf.sample(1, 0, 0, 0)
    with pytest.raises(ValueError, match="chunk bad"):
        buf.insert([chunk("ok", 1), chunk("bad", -1)], 0)
    assert len(buf) == 0 and buf.chunk_ids() == set()


# -- handing out --------------------------------------------------------------------------

def test_chunks_come_out_first_in_first_out_with_their_lengths():
    buf = QueueBuffer("queue", 1000, seed=0)
    buf.insert([chunk(f"c{i}", 10 + i) for i in range(7)], train_iteration=0)
    assert len(buf) == sum(10 + i for i in range(7))
    refs = buf.sample(batch_size=999, num_batches=3, train_iteration=0, policy_version=0)
    assert refs.chunk_ids == ["c0", "c1", "c2"]  # batch_size is ignored
    np.testing.assert_array_equal(refs.lengths, [10, 11, 12])
    np.testing.assert_array_equal(refs.chunk_index, [[0], [1], [2]])
    np.testing.assert_array_equal(refs.rows, np.zeros((3, 1)))
    np.testing.assert_array_equal(refs.item_ids, [[0], [1], [2]])
    assert refs.sequence_length is None and refs.weights is None
    assert take(buf, 3) == ["c3", "c4", "c5"]
    assert take(buf, 3) == ["c6"]
    assert take(buf, 3) == []
    assert len(buf) == 0 and buf.chunk_ids() == {f"c{i}" for i in range(7)}  # all in flight


def test_an_empty_queue_hands_out_nothing():
    refs = QueueBuffer("queue", 10, seed=0).sample(4, 2, train_iteration=0, policy_version=0)
    assert refs.chunk_ids == [] and refs.lengths.shape == (0,)
    assert refs.chunk_index.shape == refs.rows.shape == refs.item_ids.shape == (0, 1)


def test_every_chunk_is_handed_out_exactly_once():
    rng = np.random.default_rng(0)
    buf = QueueBuffer("queue", 10**9, seed=0)
    inserted, handed = [], []
    for step in range(300):
        new = [chunk(f"c{step}-{k}", int(rng.integers(1, 50))) for k in range(rng.integers(3))]
        buf.insert(new, step)
        inserted += [c.chunk_id for c in new]
        handed += take(buf, int(rng.integers(1, 4)))
    while got := take(buf, 5):
        handed += got
    assert handed == inserted  # once each, in insertion order


def test_duplicates_are_ignored_while_queued_or_in_flight():
    buf = QueueBuffer("queue", 1000, seed=0)
    buf.insert([chunk("a"), chunk("b"), chunk("a")], 0)
    assert take(buf, 1) == ["a"]
    buf.insert([chunk("a"), chunk("b")], 0)  # retried reports
    assert take(buf, 5) == ["b"]
    assert buf.monitor.inserted_chunks == 2 and buf.monitor.inserted_items == 20


# -- dropping -----------------------------------------------------------------------------

def test_overflow_drops_the_oldest_queued_chunks():
    buf = QueueBuffer("queue", 100, seed=0)
    assert buf.insert([chunk(f"c{i}", 30) for i in range(3)], 0) == []   # 90 queued
    assert take(buf, 1) == ["c0"]                                          # 60 queued
    assert buf.insert([chunk("c3", 30)], 0) == []                          # 90: in flight
    assert buf.insert([chunk("c4", 30), chunk("c5", 30)], 0) == ["c1", "c2"]  # doesn't count
    assert len(buf) == 90 and buf.monitor.dropped["overflow"] == 60
    assert buf.monitor.released_chunks == 2 and buf.stats()["dropped/overflow"] == 60.0
    assert take(buf, 5) == ["c3", "c4", "c5"]


def test_the_newest_chunk_stays_even_alone_over_capacity():
    buf = QueueBuffer("queue", 10, seed=0)
    assert buf.insert([chunk("small", 5), chunk("huge", 50)], 0) == ["small"]
    assert len(buf) == 50
    assert buf.insert([chunk("next", 1)], 0) == ["huge"]
    assert take(buf, 5) == ["next"]


def test_chunks_beyond_the_policy_lag_are_dropped_before_handing_out():
    buf = QueueBuffer("queue", 1000, seed=0, max_policy_lag=2)
    buf.insert([chunk(f"v{v}", 10, version=v) for v in (0, 4, 1, 3, 2, 5)], 0)
    assert take(buf, 1, policy_version=2) == ["v0"]          # lag 2 is allowed
    assert take(buf, 10, policy_version=5) == ["v4", "v3", "v5"]
    assert buf.monitor.dropped["policy_lag"] == 20
    assert buf.take_released() == ["v1", "v2"] and buf.take_released() == []
    assert buf.monitor.released_chunks == 2
    assert buf.chunk_ids() == {"v0", "v4", "v3", "v5"}  # in flight: never dropped for lag
    assert take(buf, 10, policy_version=100) == []


def test_released_ids_from_sampling_also_come_back_from_the_next_insert_or_consume():
    buf = QueueBuffer("queue", 1000, seed=0, max_policy_lag=0)
    buf.insert([chunk("old", version=0), chunk("new", version=1)], 0)
    assert take(buf, 1, policy_version=1) == ["new"]
    assert buf.insert([chunk("x", version=1)], 0) == ["old"]
    buf.insert([chunk("y", version=0)], 0)
    assert take(buf, 5, policy_version=1) == ["x"]
    assert buf.consume(["new"]) == ["y", "new"]


def test_no_lag_bound_or_no_policy_version_drops_nothing():
    for lag, version in ((None, 100), (0, -1)):
        buf = QueueBuffer("queue", 1000, seed=0, max_policy_lag=lag)
        buf.insert([chunk(f"c{i}", version=0) for i in range(3)], 0)
        assert take(buf, 5, policy_version=version) == ["c0", "c1", "c2"]
        assert buf.monitor.dropped["policy_lag"] == 0


# -- consume and requeue ------------------------------------------------------------------

def test_consume_releases_in_flight_chunks_only():
    buf = QueueBuffer("queue", 1000, seed=0)
    buf.insert([chunk("a", 5), chunk("b", 7), chunk("c", 9)], 0)
    assert take(buf, 2) == ["a", "b"]
    assert buf.consume(["b", "c", "zzz"]) == ["b"]  # c is queued, zzz unknown: ignored
    assert buf.consume(["b"]) == []                  # a retried report
    m = buf.monitor
    assert m.consumed_chunks == 1 and m.consumed_items == 7 and m.released_chunks == 1
    assert buf.chunk_ids() == {"a", "c"}
    assert buf.consume(["a"]) == ["a"]
    stats = buf.stats()
    assert stats["consumed_chunks"] == 2.0 and stats["consumed_items"] == 12.0
    assert stats["in_flight_chunks"] == 0.0 and stats["queued_chunks"] == 1.0


def test_requeue_puts_in_flight_chunks_back_at_the_head_in_order():
    buf = QueueBuffer("queue", 1000, seed=0)
    buf.insert([chunk(f"c{i}", 10) for i in range(6)], 0)
    assert take(buf, 3) == ["c0", "c1", "c2"]
    assert len(buf) == 30
    assert buf.requeue(["c2", "c0", "c0", "c5", "nope"]) == 2  # c5 is queued, not in flight
    assert len(buf) == 50 and buf.monitor.requeued_chunks == 2
    assert take(buf, 10) == ["c0", "c2", "c3", "c4", "c5"]
    assert buf.consume(["c0", "c1", "c2"]) == ["c0", "c1", "c2"]
    assert buf.chunk_ids() == {"c3", "c4", "c5"}


def test_requeued_chunks_can_be_dropped_for_policy_lag():
    buf = QueueBuffer("queue", 1000, seed=0, max_policy_lag=1)
    buf.insert([chunk("a", version=0), chunk("b", version=1)], 0)
    assert take(buf, 1, policy_version=0) == ["a"]
    buf.requeue(["a"])
    assert take(buf, 5, policy_version=2) == ["b"]
    assert buf.take_released() == ["a"]


# -- threads ------------------------------------------------------------------------------

def test_concurrent_learners_get_each_chunk_exactly_once():
    buf = QueueBuffer("queue", 10**9, seed=0)
    ready = threading.Condition(buf.lock)  # the coordinator's lock, as around every call
    total = 2000
    handed: list[list[str]] = [[] for _ in range(4)]
    released: list[str] = []
    done = threading.Event()
    errors: list[BaseException] = []

    def collector() -> None:
        for i in range(0, total, 5):
            with ready:
                released.extend(buf.insert([chunk(f"c{k}", 3) for k in range(i, i + 5)], i))
                ready.notify_all()
        done.set()
        with ready:
            ready.notify_all()

    def learner(k: int) -> None:
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                with ready:
                    got = buf.sample(1, 3, 0, 0).chunk_ids
                    if got:
                        released.extend(buf.consume(got))
                    elif done.is_set():
                        return
                    else:
                        ready.wait(timeout=0.5)
                handed[k].extend(got)
            raise AssertionError("learner timed out")
        except BaseException as err:  # reported by the main thread
            errors.append(err)

    threads = [threading.Thread(target=learner, args=(k,)) for k in range(4)]
    threads.append(threading.Thread(target=collector))
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads) and not errors, errors
    everyone = [c for got in handed for c in got]
    assert Counter(everyone) == Counter(f"c{k}" for k in range(total))
    assert sorted(released) == sorted(everyone)  # each released once, after its use
    for got in handed:  # each learner saw its chunks in FIFO order
        assert got == sorted(got, key=lambda c: int(c[1:]))
    assert len(buf) == 0 and buf.chunk_ids() == set()
    assert buf.monitor.consumed_chunks == total and buf.monitor.sampled_items == 3 * total


# -- snapshots ----------------------------------------------------------------------------

def busy_queue() -> QueueBuffer:
    buf = QueueBuffer("queue", 100, seed=0, max_policy_lag=3)
    buf.insert([chunk(f"c{i}", 10 + i, version=i) for i in range(8)], 1)   # overflows
    assert take(buf, 2, policy_version=4, train_iteration=2) == ["c1", "c2"]
    buf.consume(["c1"])
    buf.insert([chunk("old", 5, version=0), chunk("late", 5, version=9)], 3)
    assert take(buf, 1, policy_version=5, train_iteration=4) == ["c3"]  # drops "old"
    return buf  # in flight: c2, c3; queued: c4..c7, late; unreported release: old


def test_snapshot_restore_requeues_in_flight_chunks_at_the_head():
    buf = busy_queue()
    arrays, meta = buf.snapshot()
    arrays, meta = decode_arrays(encode_arrays(arrays, meta))  # safetensors-ready
    other = QueueBuffer("queue", 100, seed=1, max_policy_lag=3)
    other.restore(arrays, meta)
    assert other.chunk_ids() == buf.chunk_ids()
    assert len(other) == len(buf) + 12 + 13 and not other.in_flight
    assert other.take_released() == ["old"]
    # c2 and c3 are queued again: their handing out is taken back, as they will be again
    assert other.stats()["sampled_items"] == buf.stats()["sampled_items"] - 12 - 13
    for key in ("inserted_items", "inserted_chunks", "released_chunks",
                "dropped_items", "dropped/overflow", "dropped/policy_lag", "consumed_chunks",
                "consumed_items", "staleness_mean", "policy_lag_mean"):
        assert other.stats()[key] == buf.stats()[key], key
    refs = other.sample(1, 10, train_iteration=5, policy_version=5)
    assert refs.chunk_ids == ["c2", "c3", "c4", "c5", "c6", "c7", "late"]
    np.testing.assert_array_equal(refs.lengths, [12, 13, 14, 15, 16, 17, 5])
    np.testing.assert_array_equal(refs.item_ids.reshape(-1), [2, 3, 4, 5, 6, 7, 9])
    other.insert([chunk("after")], 6)
    assert other.queue["after"].uid == buf.next_uid  # ids continue, never reused


def test_snapshot_restore_round_trips_exactly_without_in_flight_chunks():
    buf = busy_queue()
    buf.requeue(["c2", "c3"])
    arrays, meta = buf.snapshot()
    other = QueueBuffer("queue", 100, seed=1)
    other.restore(*decode_arrays(encode_arrays(arrays, meta)))
    again_arrays, again_meta = other.snapshot()
    assert again_meta == meta
    for key in arrays:
        np.testing.assert_array_equal(again_arrays[key], arrays[key], err_msg=key)
    assert other.stats() == buf.stats()
    for step in range(4):
        a, b = (q.sample(1, 2, step, 5) for q in (buf, other))
        assert a.chunk_ids == b.chunk_ids
        np.testing.assert_array_equal(a.item_ids, b.item_ids)
        np.testing.assert_array_equal(a.lengths, b.lengths)


def test_restore_refuses_another_kind_or_capacity():
    arrays, meta = busy_queue().snapshot()
    with pytest.raises(ValueError, match="cannot restore buffers.queue"):
        QueueBuffer("queue", 101, seed=0).restore(arrays, meta)
    with pytest.raises(ValueError, match="cannot restore buffers.queue"):
        QueueBuffer("queue", 100, seed=0).restore(arrays, {**meta, "kind": "uniform"})
