"""shared/replay/buffers/ring.py UniformBuffer: the transition ring's bookkeeping and uniform
sampling over the items it holds.

What the ring shares with the prioritized buffer (released chunks against a model of the
ring, sample_range, sampling without replacement, bad requests) and the rate limiter
(shared/replay/buffers/ratelimit.py) are tested in test_prioritized.py; the buffers are not
thread-safe on their own (the coordinator holds one lock around them), and that lock's use
with the limiter is tested there too.
"""

from __future__ import annotations

import numpy as np
import pytest

from rlfleet.shared.replay.buffers.base import ChunkInfo
from rlfleet.shared.replay.buffers.ring import UniformBuffer


def chunk(chunk_id: str, length: int, version: int = 0) -> ChunkInfo:
    return ChunkInfo(chunk_id, length, version)


def uniform(capacity: int, seed: int = 0) -> UniformBuffer:
    return UniformBuffer("u", capacity, seed)


def chi_square(observed: np.ndarray, expected: np.ndarray) -> float:
    return float(((observed - expected) ** 2 / expected).sum())


def chi_square_bound(df: int) -> float:
    """About five standard deviations above the chi-square mean: a fixed seed decides the
    outcome, the bound only keeps the test honest about what 'uniform' means."""
    return df + 5 * np.sqrt(2 * df)


# -- insertion and eviction -----------------------------------------------------------------

def test_capacity_must_be_positive():
    with pytest.raises(ValueError, match="capacity=0"):
        uniform(0)


def test_insert_counts_transitions_and_chunks():
    buf = uniform(1000)
    assert len(buf) == 0 and buf.chunk_ids() == set()
    assert buf.insert([chunk("a", 10), chunk("b", 20)], 0) == []
    assert len(buf) == 30 and buf.chunk_ids() == {"a", "b"}
    m = buf.monitor
    assert m.inserted_chunks == 2 and m.inserted_items == 30
    assert m.evicted_items == 0 and m.released_chunks == 0
    assert buf.next_uid == 30


def test_exactly_full_evicts_nothing_and_one_more_item_evicts_one():
    buf = uniform(100)
    assert buf.insert([chunk("a", 60), chunk("b", 40)], 0) == []
    assert len(buf) == 100 and buf.monitor.evicted_items == 0
    assert buf.insert([chunk("c", 1)], 0) == []  # a's first row goes, a stays
    assert len(buf) == 100 and buf.monitor.evicted_items == 1
    assert buf.chunk_ids() == {"a", "b", "c"}
    assert buf.insert([chunk("d", 59)], 0) == ["a"]  # a's last row goes: a is released
    assert buf.chunk_ids() == {"b", "c", "d"}
    assert buf.monitor.evicted_items == 60 and buf.monitor.released_chunks == 1


def test_a_retried_report_and_an_id_listed_twice_are_ignored():
    buf = uniform(1000)
    buf.insert([chunk("a", 10)], 0)
    assert buf.insert([chunk("a", 10), chunk("b", 5), chunk("b", 5)], 0) == []
    assert len(buf) == 15 and buf.chunk_ids() == {"a", "b"}
    assert buf.monitor.inserted_chunks == 2 and buf.monitor.inserted_items == 15


# -- sampling -------------------------------------------------------------------------------

def test_samples_are_valid_references():
    lengths = {"a": 3, "b": 17, "c": 1, "d": 40}
    buf = uniform(1000, seed=1)
    buf.insert([chunk(k, n) for k, n in lengths.items()], 0)
    refs = buf.sample(batch_size=32, num_batches=5, train_iteration=0, policy_version=0)
    assert refs.chunk_index.shape == refs.rows.shape == refs.item_ids.shape == (5, 32)
    assert refs.weights is None and refs.sequence_length is None and refs.lengths is None
    assert len(set(refs.chunk_ids)) == len(refs.chunk_ids)
    assert set(refs.chunk_ids) <= set(lengths)
    assert refs.chunk_index.min() >= 0 and refs.chunk_index.max() < len(refs.chunk_ids)
    # every listed chunk is used at least once
    assert set(np.unique(refs.chunk_index)) == set(range(len(refs.chunk_ids)))
    chunk_len = np.array([lengths[c] for c in refs.chunk_ids])[refs.chunk_index]
    assert (refs.rows >= 0).all() and (refs.rows < chunk_len).all()
    # an item id names its (chunk, row): ids were handed out in insertion order
    first_uid = dict(zip(lengths, np.cumsum([0, *lengths.values()])[:-1].tolist(),
                         strict=True))
    start = np.array([first_uid[c] for c in refs.chunk_ids])[refs.chunk_index]
    np.testing.assert_array_equal(refs.item_ids, start + refs.rows)
    assert buf.monitor.sampled_items == 160


def test_samples_never_reference_overwritten_items():
    """A ring of 50: `old` (uids 0..39) loses its rows 0..19 to `new` (uids 40..69)."""
    buf = uniform(50, seed=2)
    buf.insert([chunk("old", 40)], 0)
    buf.insert([chunk("new", 30)], 0)
    refs = buf.sample(64, 40, 0, 0)
    names = np.array(refs.chunk_ids)[refs.chunk_index]
    assert set(refs.chunk_ids) == {"old", "new"}
    assert (refs.rows[names == "old"] >= 20).all() and (refs.rows[names == "old"] < 40).all()
    assert (refs.rows[names == "new"] < 30).all()
    assert set(refs.item_ids.ravel().tolist()) == set(range(20, 70))


def test_sampling_is_uniform_over_transitions():
    lengths = np.array([1, 7, 20, 64, 128, 300])
    buf = uniform(10_000, seed=1234)
    buf.insert([chunk(f"c{i}", int(n)) for i, n in enumerate(lengths)], 0)
    n_samples = 64 * 1000
    refs = buf.sample(batch_size=64, num_batches=1000, train_iteration=0, policy_version=0)
    picked = np.array([int(c[1:]) for c in refs.chunk_ids])[refs.chunk_index].ravel()
    counts = np.bincount(picked, minlength=len(lengths))
    expected = n_samples * lengths / lengths.sum()
    # each chunk's share follows its length ...
    assert chi_square(counts, expected) < chi_square_bound(len(lengths) - 1)
    np.testing.assert_allclose(counts / n_samples, lengths / lengths.sum(), atol=0.01)
    # ... and within a chunk every row is equally likely
    rows = refs.rows.ravel()[picked == 5]
    row_counts = np.bincount(rows, minlength=300)
    assert chi_square(row_counts, np.full(300, len(rows) / 300)) < chi_square_bound(299)


def test_sampling_after_eviction_stays_uniform_over_the_items_held():
    """Chunks of 25 and 50 rows through a ring of 190: each chunk's share is the number of
    its rows still in the ring, a partly overwritten chunk included."""
    buf = uniform(190, seed=7)
    sizes = [50 if i % 2 else 25 for i in range(10)]  # 375 items: uids 185..374 are held
    for i, n in enumerate(sizes):
        buf.insert([chunk(f"c{i}", n)], 0)
    starts = np.cumsum([0, *sizes[:-1]])
    live = np.array([max(0, min(s + n, 375) - max(s, 185))
                     for s, n in zip(starts, sizes, strict=True)])
    assert live.sum() == len(buf) == 190 and 0 < live[5] < sizes[5]  # c5 is cut
    assert buf.chunk_ids() == {f"c{i}" for i in range(10) if live[i] > 0}
    refs = buf.sample(100, 200, 0, 0)
    picked = np.array([int(c[1:]) for c in refs.chunk_ids])[refs.chunk_index].ravel()
    held = live > 0
    counts = np.bincount(picked, minlength=10)[held]
    assert chi_square(counts, picked.size * live[held] / 190) < chi_square_bound(
        int(held.sum()) - 1)


def test_same_seed_same_samples():
    def draw(seed):
        buf = uniform(100, seed=seed)
        buf.insert([chunk("a", 10), chunk("b", 30)], 0)
        r = buf.sample(8, 3, 0, 0)
        return r.chunk_ids, r.chunk_index.tolist(), r.rows.tolist()

    assert draw(5) == draw(5)
    assert draw(5) != draw(6)


def test_monitor_counts_uses_staleness_and_policy_lag():
    buf = uniform(100, seed=3)
    buf.insert([chunk("a", 10, version=2)], train_iteration=5)
    buf.insert([chunk("b", 10, version=4)], train_iteration=8)
    refs = buf.sample(10, 4, train_iteration=10, policy_version=6)
    names = np.array(refs.chunk_ids)[refs.chunk_index]
    from_a = int((names == "a").sum())
    m = buf.monitor
    assert m.sampled_items == 40 and buf.use_counts().sum() == 40
    assert m.staleness_sum == from_a * 5 + (40 - from_a) * 2
    assert m.lag_sum == from_a * 4 + (40 - from_a) * 2 and m.lag_count == 40
    stats = buf.stats()
    assert stats["size"] == 20 and stats["sampled_items"] == 40
    assert stats["staleness_mean"] == pytest.approx(m.staleness_sum / 40)
    assert stats["use_count_mean"] == pytest.approx(2.0)
    # no policy version yet (-1): staleness counts, lag does not
    buf.sample(10, 1, train_iteration=10, policy_version=-1)
    assert m.lag_count == 40 and m.staleness_count == 50
