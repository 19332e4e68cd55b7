"""coordinator/buffer.py (UniformBuffer) and coordinator/ratio.py (ReplayRatio)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from coordinator.buffer import Item, UniformBuffer
from coordinator.ratio import ReplayRatio


def item(chunk_id: str, length: int, version: int = 0) -> Item:
    return Item(chunk_id, length, version, inserted_at=0.0)


def chi_square(observed: np.ndarray, expected: np.ndarray) -> float:
    return float(((observed - expected) ** 2 / expected).sum())


def chi_square_bound(df: int) -> float:
    """About five standard deviations above the chi-square mean: a fixed seed decides the
    outcome, the bound only keeps the test honest about what 'uniform' means."""
    return df + 5 * np.sqrt(2 * df)


# -- insertion and eviction -----------------------------------------------------------------

def test_capacity_must_be_positive():
    with pytest.raises(ValueError, match="capacity=0"):
        UniformBuffer(0)


def test_insert_counts_transitions_and_chunks():
    buf = UniformBuffer(1000)
    assert len(buf) == 0 and buf.num_chunks == 0
    assert buf.insert([item("a", 10), item("b", 20)]) == []
    assert len(buf) == 30 and buf.num_chunks == 2
    assert "a" in buf and "b" in buf and "c" not in buf
    assert buf.chunk_ids() == ["a", "b"]
    assert buf.inserted_chunks == 2


def test_eviction_is_oldest_first_and_returns_evicted_ids():
    buf = UniformBuffer(100)
    assert buf.insert([item(f"c{i}", 30) for i in range(3)]) == []        # 90
    assert buf.insert([item("c3", 30)]) == ["c0"]                          # 120 -> 90
    assert buf.chunk_ids() == ["c1", "c2", "c3"] and len(buf) == 90
    assert buf.insert([item("c4", 50), item("c5", 10)]) == ["c1", "c2"]   # 150 -> 90
    assert buf.chunk_ids() == ["c3", "c4", "c5"] and len(buf) == 90
    assert buf.evicted_chunks == 3
    assert "c0" not in buf and "c1" not in buf


def test_exactly_full_is_not_evicted():
    buf = UniformBuffer(100)
    assert buf.insert([item("a", 60), item("b", 40)]) == []
    assert len(buf) == 100
    assert buf.insert([item("c", 1)]) == ["a"]
    assert len(buf) == 41


def test_a_chunk_larger_than_capacity_is_kept_alone():
    buf = UniformBuffer(10)
    buf.insert([item("small", 5)])
    assert buf.insert([item("huge", 50)]) == ["small"]
    assert buf.chunk_ids() == ["huge"] and len(buf) == 50
    assert buf.insert([item("next", 1)]) == ["huge"]
    assert buf.chunk_ids() == ["next"]


def test_duplicates_are_ignored():
    buf = UniformBuffer(1000)
    buf.insert([item("a", 10)])
    assert buf.insert([item("a", 10), item("b", 5), item("b", 5)]) == []
    assert len(buf) == 15 and buf.num_chunks == 2
    assert buf.chunk_ids() == ["a", "b"]
    assert buf.inserted_chunks == 2


def test_evicted_ids_are_never_still_held():
    rng = np.random.default_rng(3)
    buf = UniformBuffer(500)
    all_evicted: list[str] = []
    for i in range(200):
        all_evicted += buf.insert([item(f"c{i}", int(rng.integers(1, 60)))])
        assert len(buf) <= 500 or buf.num_chunks == 1
    held = set(buf.chunk_ids())
    assert held.isdisjoint(all_evicted)
    assert len(all_evicted) == len(set(all_evicted)) == buf.evicted_chunks
    assert held | set(all_evicted) == {f"c{i}" for i in range(200)}


# -- sampling -------------------------------------------------------------------------------

def test_empty_buffer_sampling_raises():
    with pytest.raises(ValueError, match="empty"):
        UniformBuffer(10).sample(4, 2)


def test_samples_are_valid_references():
    lengths = {"a": 3, "b": 17, "c": 1, "d": 40}
    buf = UniformBuffer(1000, seed=1)
    buf.insert([item(k, n) for k, n in lengths.items()])
    refs = buf.sample(batch_size=32, num_batches=5)
    assert refs.chunk_index.shape == (5, 32) and refs.rows.shape == (5, 32)
    assert len(set(refs.chunk_ids)) == len(refs.chunk_ids)
    assert set(refs.chunk_ids) <= set(lengths)
    assert refs.chunk_index.min() >= 0 and refs.chunk_index.max() < len(refs.chunk_ids)
    # every listed chunk is used at least once
    assert set(np.unique(refs.chunk_index)) == set(range(len(refs.chunk_ids)))
    chunk_len = np.array([lengths[c] for c in refs.chunk_ids])[refs.chunk_index]
    assert (refs.rows >= 0).all() and (refs.rows < chunk_len).all()
    assert buf.sampled_items == 160


def test_samples_never_reference_evicted_chunks():
    buf = UniformBuffer(50, seed=2)
    buf.insert([item("old", 40)])
    buf.insert([item("new", 30)])
    refs = buf.sample(64, 4)
    assert refs.chunk_ids == ["new"]
    assert (refs.rows < 30).all()


def test_sampling_is_uniform_over_transitions():
    lengths = np.array([1, 7, 20, 64, 128, 300])
    buf = UniformBuffer(10_000, seed=1234)
    buf.insert([item(f"c{i}", int(n)) for i, n in enumerate(lengths)])
    n_samples = 64 * 1000
    refs = buf.sample(batch_size=64, num_batches=1000)
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


def test_sampling_after_eviction_stays_uniform():
    buf = UniformBuffer(200, seed=7)
    for i in range(10):
        buf.insert([item(f"c{i}", 50 if i % 2 else 25)])
    held = buf.chunk_ids()
    lengths = np.array([50 if int(c[1:]) % 2 else 25 for c in held])
    assert lengths.sum() == len(buf) <= 200
    refs = buf.sample(100, 200)
    index = {c: i for i, c in enumerate(held)}
    picked = np.array([index[c] for c in refs.chunk_ids])[refs.chunk_index].ravel()
    counts = np.bincount(picked, minlength=len(held))
    assert chi_square(counts, picked.size * lengths / lengths.sum()) < \
        chi_square_bound(len(held) - 1)


def test_same_seed_same_samples():
    def draw(seed):
        buf = UniformBuffer(100, seed=seed)
        buf.insert([item("a", 10), item("b", 30)])
        r = buf.sample(8, 3)
        return r.chunk_ids, r.chunk_index.tolist(), r.rows.tolist()

    assert draw(5) == draw(5)
    assert draw(5) != draw(6)


def test_concurrent_insert_and_sample_stay_consistent():
    buf = UniformBuffer(1000, seed=0)
    buf.insert([item("seed", 10)])
    errors: list[BaseException] = []
    done = threading.Event()

    def inserter():
        for i in range(2000):
            buf.insert([item(f"c{i}", 1 + i % 13)])
        done.set()

    def sampler():
        try:
            while not done.is_set():
                refs = buf.sample(16, 2)
                assert (refs.rows >= 0).all()
        except BaseException as err:  # surfaced below
            errors.append(err)

    threads = [threading.Thread(target=inserter), threading.Thread(target=sampler)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors
    assert len(buf) <= 1000


# -- the replay ratio ---------------------------------------------------------------------------

def test_nothing_is_granted_before_learning_starts_or_on_an_empty_buffer():
    r = ReplayRatio(updates_per_env_step=0.25, learning_starts=1000, tolerance=100)
    assert r.grantable(999, 0, 999) == 0
    assert r.grantable(5000, 0, 0) == 0
    assert r.grantable(1000, 0, 1000) == 100      # on the line: the tolerance band


def test_grants_follow_the_line_plus_tolerance():
    r = ReplayRatio(updates_per_env_step=0.25, learning_starts=1000, tolerance=100)
    assert r.target(1000) == 0 and r.target(500) == 0
    assert r.target(2000) == 250
    assert r.grantable(2000, 0, 2000) == 350
    assert r.grantable(2000, 300, 2000) == 50
    assert r.grantable(2000, 350, 2000) == 0
    assert r.grantable(2000, 400, 2000) == 0      # never negative


def test_free_running_ratio_grants_without_limit_and_never_throttles():
    r = ReplayRatio(updates_per_env_step=None, learning_starts=10, tolerance=1)
    assert r.grantable(9, 0, 9) == 0
    assert r.grantable(10, 10**6, 10) >= 1 << 20
    assert not r.collector_ahead(10**9, 0)


def test_collectors_wait_only_when_the_learner_is_over_tolerance_behind():
    r = ReplayRatio(updates_per_env_step=0.5, learning_starts=100, tolerance=10)
    assert not r.collector_ahead(50, 0)          # before learning starts
    assert not r.collector_ahead(120, 0)         # target 10, 0 >= 10 - 10
    assert r.collector_ahead(124, 0)             # target 12: 0 < 2
    assert not r.collector_ahead(124, 2)
    assert r.collector_ahead(1100, 489)          # target 500: 489 < 490
    assert not r.collector_ahead(1100, 490)


def test_both_sides_following_the_rules_stay_within_the_band():
    """Collectors add chunks unless told to wait, a learner takes every grant: the granted
    iterations stay within `tolerance` of the line (plus one chunk's worth)."""
    r = ReplayRatio(updates_per_env_step=0.25, learning_starts=200, tolerance=40)
    rng = np.random.default_rng(0)
    env_steps = granted = 0
    chunk = 32
    for _ in range(5000):
        if rng.random() < 0.5:
            if not r.collector_ahead(env_steps, granted):
                env_steps += chunk
        else:
            granted += min(int(rng.integers(1, 20)), r.grantable(env_steps, granted, env_steps))
        if env_steps >= r.learning_starts:
            gap = granted - r.target(env_steps)
            assert -r.tolerance - chunk * 0.25 <= gap <= r.tolerance
    assert env_steps > 10 * chunk and granted > 0
