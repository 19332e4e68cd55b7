"""shared/replay/buffers/episode.py (EpisodeBuffer): sequences inside episode segments."""

from __future__ import annotations

import numpy as np
import pytest

from rlfleet.shared.contract.codec import decode_arrays, encode_arrays
from rlfleet.shared.replay.buffers.base import ChunkInfo, SampleError
from rlfleet.shared.replay.buffers.episode import EpisodeBuffer


def chunk(chunk_id: str, length: int, segments: tuple = (), version: int = 0) -> ChunkInfo:
    return ChunkInfo(chunk_id, length, version, tuple(segments))


def random_segments(rng: np.random.Generator, length: int) -> tuple[tuple[int, int], ...]:
    """Cut `length` rows into runs of 1..12 rows (many shorter than the sequences drawn)."""
    cuts, row = [], 0
    while row < length:
        n = min(int(rng.integers(1, 13)), length - row)
        cuts.append((row, n))
        row += n
    return tuple(cuts)


def valid_starts(info: ChunkInfo, seq_len: int) -> list[int]:
    runs = info.segments or ((0, info.length),)
    return [s + k for s, n in runs for k in range(max(0, n - seq_len + 1))]


def chi_square(observed: np.ndarray, expected: np.ndarray) -> float:
    return float(((observed - expected) ** 2 / expected).sum())


def chi_square_bound(df: int) -> float:
    """About five standard deviations above the chi-square mean: the fixed seed decides the
    outcome, the bound only keeps the test honest about what 'uniform' means."""
    return df + 5 * np.sqrt(2 * df)


def flat_pairs(buf: EpisodeBuffer, refs) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(chunk id, first row, item id) per sampled sequence."""
    names = [refs.chunk_ids[i] for i in refs.chunk_index.reshape(-1).tolist()]
    return names, refs.rows.reshape(-1), refs.item_ids.reshape(-1)


def assert_same_refs(a, b) -> None:
    assert a.chunk_ids == b.chunk_ids
    for key in ("chunk_index", "rows", "item_ids"):
        np.testing.assert_array_equal(getattr(a, key), getattr(b, key))
    assert a.sequence_length == b.sequence_length and a.weights is None and b.weights is None


# -- construction and validation ----------------------------------------------------------

def test_sequence_length_and_capacity_must_be_positive():
    with pytest.raises(ValueError, match="sequence_length=0"):
        EpisodeBuffer("episode", 100, seed=0, sequence_length=0)
    with pytest.raises(ValueError, match="capacity=0"):
        EpisodeBuffer("episode", 0, seed=0)


@pytest.mark.parametrize("segments", [((0, 5), (4, 3)), ((0, 11),), ((-1, 3),), ((2, -1),)])
def test_bad_segments_are_refused_before_anything_changes(segments):
    buf = EpisodeBuffer("episode", 100, seed=0, sequence_length=2)
    with pytest.raises(ValueError, match="chunk bad"):
        buf.insert([chunk("good", 10), chunk("bad", 10, segments)], train_iteration=0)
    assert len(buf) == 0 and buf.chunk_ids() == set() and buf.monitor.inserted_chunks == 0


def test_segments_may_come_in_any_order_and_leave_gaps():
    buf = EpisodeBuffer("episode", 100, seed=0, sequence_length=3)
    buf.insert([chunk("a", 20, ((10, 4), (0, 3)))], train_iteration=0)
    refs = buf.sample(200, 1, train_iteration=0, policy_version=0)
    assert set(refs.rows.reshape(-1).tolist()) == {0, 10, 11}
    assert len(buf) == 20 and buf.num_sequences == 3


# -- sampling -----------------------------------------------------------------------------

def test_no_segments_means_the_whole_chunk_is_one_segment():
    buf = EpisodeBuffer("episode", 100, seed=0, sequence_length=4)
    buf.insert([chunk("a", 10)], train_iteration=0)
    assert buf.num_sequences == 7
    refs = buf.sample(100, 3, train_iteration=0, policy_version=0)
    assert refs.chunk_ids == ["a"] and refs.rows.shape == (3, 100)
    assert refs.sequence_length == 4 and refs.weights is None
    assert set(refs.rows.reshape(-1).tolist()) == set(range(7))


def test_sequences_never_cross_a_segment_boundary():
    rng = np.random.default_rng(7)
    seq_len = 5
    infos = []
    for i in range(40):
        length = int(rng.integers(1, 80))
        segments = random_segments(rng, length) if i % 5 else ()  # some whole-chunk ones
        infos.append(chunk(f"c{i}", length, segments))
    buf = EpisodeBuffer("episode", 10_000, seed=3, sequence_length=seq_len)
    buf.insert(infos, train_iteration=0)
    by_id = {info.chunk_id: info for info in infos}
    starts = {cid: set(valid_starts(info, seq_len)) for cid, info in by_id.items()}
    item_of: dict[tuple[str, int], int] = {}
    for _ in range(20):
        refs = buf.sample(256, 4, train_iteration=0, policy_version=0)
        for cid, row, item in zip(*flat_pairs(buf, refs), strict=True):
            row = int(row)
            assert row in starts[cid], f"{cid} row {row}: sequence leaves its segment"
            assert item_of.setdefault((cid, row), int(item)) == int(item)
    # item ids and (chunk, first row) pairs name each other one to one
    assert len(set(item_of.values())) == len(item_of)
    assert buf.num_sequences == sum(len(s) for s in starts.values())


def test_sampling_is_uniform_over_valid_starts():
    rng = np.random.default_rng(11)
    seq_len = 3
    infos = [chunk(f"c{i}", 30, random_segments(rng, 30)) for i in range(6)]
    buf = EpisodeBuffer("episode", 10_000, seed=5, sequence_length=seq_len)
    buf.insert(infos, train_iteration=0)
    all_starts = [(info.chunk_id, r) for info in infos for r in valid_starts(info, seq_len)]
    assert buf.num_sequences == len(all_starts)
    index = {pair: k for k, pair in enumerate(all_starts)}
    counts = np.zeros(len(all_starts))
    per_start = 300
    refs = buf.sample(len(all_starts), per_start, train_iteration=0, policy_version=0)
    names, rows, _ = flat_pairs(buf, refs)
    for cid, row in zip(names, rows.tolist(), strict=True):
        counts[index[(cid, row)]] += 1
    assert (counts > 0).all()
    expected = np.full(len(all_starts), float(per_start))
    assert chi_square(counts, expected) < chi_square_bound(len(all_starts) - 1)


def test_long_segments_are_not_favoured_per_segment():
    """Uniform over starts, not over segments: a 100-row segment holds 98 of the 99 starts."""
    buf = EpisodeBuffer("episode", 1000, seed=0, sequence_length=3)
    buf.insert([chunk("a", 103, ((0, 3), (3, 100)))], train_iteration=0)
    rows = buf.sample(1000, 10, train_iteration=0, policy_version=0).rows
    share = float((rows == 0).mean())
    assert abs(share - 1 / 99) < 0.005


def test_sample_errors():
    buf = EpisodeBuffer("episode", 100, seed=0, sequence_length=4)
    with pytest.raises(SampleError, match="no segment of at least sequence_length=4"):
        buf.sample(1, 1, train_iteration=0, policy_version=0)
    buf.insert([chunk("a", 10)], train_iteration=0)
    with pytest.raises(SampleError, match="batch_size=0"):
        buf.sample(0, 1, train_iteration=0, policy_version=0)
    with pytest.raises(SampleError, match="num_batches=0"):
        buf.sample(1, 0, train_iteration=0, policy_version=0)


def test_a_chunk_without_a_long_enough_segment_is_released_at_once():
    buf = EpisodeBuffer("episode", 100, seed=0, sequence_length=4)
    assert buf.insert([chunk("short", 6, ((0, 3), (3, 3))), chunk("ok", 4)], 0) == ["short"]
    assert buf.chunk_ids() == {"ok"} and len(buf) == 4
    assert buf.monitor.dropped["too_short"] == 6 and buf.monitor.released_chunks == 1
    assert buf.monitor.inserted_items == 4 and buf.monitor.inserted_chunks == 1
    only_short = EpisodeBuffer("episode", 100, seed=0, sequence_length=4)
    assert only_short.insert([chunk("x", 3)], 0) == ["x"]
    with pytest.raises(SampleError):
        only_short.sample(1, 1, 0, 0)


def test_short_segments_are_skipped_but_their_rows_count():
    buf = EpisodeBuffer("episode", 100, seed=0, sequence_length=4)
    buf.insert([chunk("a", 12, ((0, 2), (2, 5), (7, 1), (8, 4)))], 0)
    assert len(buf) == 12 and buf.num_sequences == 3
    assert buf.use_counts().size == 2  # one per segment that holds a start
    rows = buf.sample(300, 1, 0, 0).rows
    assert set(rows.reshape(-1).tolist()) == {2, 3, 8}


# -- inserting and eviction ---------------------------------------------------------------

def test_eviction_is_whole_chunks_oldest_first():
    buf = EpisodeBuffer("episode", 100, seed=0, sequence_length=2)
    assert buf.insert([chunk(f"c{i}", 30, ((0, 10), (10, 20))) for i in range(3)], 0) == []
    assert buf.insert([chunk("c3", 30)], 1) == ["c0"]
    assert buf.chunk_ids() == {"c1", "c2", "c3"} and len(buf) == 90
    assert buf.insert([chunk("c4", 50), chunk("c5", 10)], 2) == ["c1", "c2"]
    assert buf.chunk_ids() == {"c3", "c4", "c5"} and len(buf) == 90
    assert buf.monitor.evicted_items == 90 and buf.monitor.released_chunks == 3
    refs = buf.sample(500, 1, 2, 0)
    assert set(refs.chunk_ids) == {"c3", "c4", "c5"}
    assert buf.num_sequences == 29 + 49 + 9


def test_exactly_full_is_not_evicted():
    buf = EpisodeBuffer("episode", 100, seed=0)
    assert buf.insert([chunk("a", 60), chunk("b", 40)], 0) == []
    assert len(buf) == 100
    assert buf.insert([chunk("c", 1)], 0) == ["a"]
    assert len(buf) == 41


def test_the_newest_chunk_stays_even_alone_over_capacity():
    buf = EpisodeBuffer("episode", 10, seed=0)
    buf.insert([chunk("small", 5)], 0)
    assert buf.insert([chunk("huge", 50, ((0, 20), (20, 30)))], 0) == ["small"]
    assert buf.chunk_ids() == {"huge"} and len(buf) == 50
    assert buf.insert([chunk("next", 1)], 0) == ["huge"]
    assert buf.chunk_ids() == {"next"} and buf.num_sequences == 1


def test_a_chunk_inserted_and_evicted_in_one_call_is_released():
    buf = EpisodeBuffer("episode", 10, seed=0)
    assert buf.insert([chunk("a", 8), chunk("b", 8), chunk("c", 8)], 0) == ["a", "b"]
    assert buf.chunk_ids() == {"c"}


def test_duplicates_are_ignored():
    buf = EpisodeBuffer("episode", 1000, seed=0, sequence_length=2)
    buf.insert([chunk("a", 10)], 0)
    assert buf.insert([chunk("a", 10), chunk("b", 5), chunk("b", 5)], 0) == []
    assert len(buf) == 15 and buf.chunk_ids() == {"a", "b"}
    assert buf.monitor.inserted_chunks == 2 and buf.num_sequences == 9 + 4


def test_item_ids_are_unique_and_never_reused():
    buf = EpisodeBuffer("episode", 20, seed=0, sequence_length=3)
    pair_of: dict[int, tuple[str, int]] = {}
    for i in range(10):  # capacity holds two chunks: evictions all along
        buf.insert([chunk(f"c{i}", 10, ((0, 4), (4, 6)))], i)
        for cid, row, item in zip(*flat_pairs(buf, buf.sample(200, 1, i, 0)), strict=True):
            assert pair_of.setdefault(int(item), (cid, int(row))) == (cid, int(row))
    assert len(pair_of) > 20 and buf.next_uid == 10 * (2 + 4)


# -- monitor ------------------------------------------------------------------------------

def test_monitor_counts_transitions_staleness_and_policy_lag():
    buf = EpisodeBuffer("episode", 1000, seed=0, sequence_length=4)
    buf.insert([chunk("a", 10, version=3)], train_iteration=5)
    buf.sample(8, 2, train_iteration=9, policy_version=7)
    buf.sample(4, 1, train_iteration=9, policy_version=-1)  # unknown version: no lag
    m = buf.monitor
    assert m.inserted_items == 10 and m.sampled_items == (16 + 4) * 4
    stats = buf.stats()
    assert stats["staleness_mean"] == 4.0 and stats["policy_lag_mean"] == 4.0
    assert stats["sequences"] == 7.0 and stats["segments"] == 1.0 and stats["chunks"] == 1.0
    assert int(buf.use_counts().sum()) == 20


# -- snapshots ----------------------------------------------------------------------------

def filled_buffer(seed: int = 1) -> EpisodeBuffer:
    rng = np.random.default_rng(0)
    buf = EpisodeBuffer("episode", 300, seed=seed, sequence_length=4)
    for i in range(12):  # overflows: evictions leave free entries in the chunk table
        length = int(rng.integers(20, 60))
        buf.insert([chunk(f"c{i}", length, random_segments(rng, length), version=i)], i)
        buf.sample(16, 2, train_iteration=i, policy_version=i)
    buf.insert([chunk("tiny", 2)], 12)  # a too-short drop in the counters
    return buf


def test_snapshot_restore_round_trips_exactly():
    buf = filled_buffer()
    assert buf.table._free, "the test wants a chunk table with free entries"
    arrays, meta = buf.snapshot()
    arrays2, meta2 = decode_arrays(encode_arrays(arrays, meta))  # safetensors-ready
    assert meta2 == meta
    other = EpisodeBuffer("episode", 300, seed=999, sequence_length=4)
    other.restore(arrays2, meta2)
    again_arrays, again_meta = other.snapshot()
    assert again_meta == meta
    assert again_arrays.keys() == arrays.keys()
    for key in arrays:
        np.testing.assert_array_equal(again_arrays[key], arrays[key], err_msg=key)
        assert again_arrays[key].dtype == arrays[key].dtype, key
    assert len(other) == len(buf) and other.chunk_ids() == buf.chunk_ids()
    assert other.stats() == buf.stats()
    # The rng state travels too: both buffers now behave identically, inserts included.
    for step in range(5):
        assert_same_refs(buf.sample(32, 3, 20 + step, 12), other.sample(32, 3, 20 + step, 12))
        new = [chunk(f"n{step}", 40, ((0, 15), (15, 25)), version=13)]
        assert buf.insert(new, 20 + step) == other.insert(new, 20 + step)
    assert other.stats() == buf.stats()


def test_snapshot_does_not_share_memory_with_the_buffer():
    buf = filled_buffer()
    arrays, _ = buf.snapshot()
    uses = arrays["seg_uses"].copy()
    buf.sample(64, 4, 30, 12)
    np.testing.assert_array_equal(arrays["seg_uses"], uses)


def test_an_empty_buffer_round_trips():
    buf = EpisodeBuffer("episode", 50, seed=2, sequence_length=2)
    arrays, meta = decode_arrays(encode_arrays(*buf.snapshot()))
    other = EpisodeBuffer("episode", 50, seed=3, sequence_length=2)
    other.restore(arrays, meta)
    assert len(other) == 0 and other.chunk_ids() == set()
    for b in (buf, other):
        b.insert([chunk("a", 10)], 0)
    assert_same_refs(buf.sample(8, 1, 0, 0), other.sample(8, 1, 0, 0))


@pytest.mark.parametrize("kwargs", [{"capacity": 301}, {"sequence_length": 5}])
def test_restore_refuses_a_different_shape(kwargs):
    arrays, meta = filled_buffer().snapshot()
    args = {"capacity": 300, "sequence_length": 4, **kwargs}
    other = EpisodeBuffer("episode", args["capacity"], seed=0,
                          sequence_length=args["sequence_length"])
    with pytest.raises(ValueError, match="cannot restore buffers.episode"):
        other.restore(arrays, meta)
