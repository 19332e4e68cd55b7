"""shared/replay/buffers/sumtree.py: the sum and min segment trees behind prioritized replay.

`find` is checked against a plain reference (`np.searchsorted` over the cumulative sums,
side="right": a mass exactly on an interval's left edge belongs to that interval). Values are
small integers wherever exact edges matter, so the cumulative sums are exact in float64.
"""

from __future__ import annotations

import numpy as np
import pytest

from rlfleet.shared.replay.buffers.sumtree import MinTree, SumTree


def leaves(tree: SumTree | MinTree) -> np.ndarray:
    return tree.tree[tree.size:tree.size + tree.capacity]


def reference_find(values: np.ndarray, mass: np.ndarray) -> np.ndarray:
    """The slot whose half-open interval [cum[i-1], cum[i]) holds each mass."""
    return np.searchsorted(np.cumsum(values), mass, side="right")


def assert_consistent(tree: SumTree) -> None:
    """Every internal node is the sum of its two children (exactly: same additions)."""
    internal = np.arange(1, tree.size)
    np.testing.assert_array_equal(tree.tree[internal],
                                  tree.tree[2 * internal] + tree.tree[2 * internal + 1])


def filled(values: list[float] | np.ndarray) -> SumTree:
    values = np.asarray(values, dtype=np.float64)
    tree = SumTree(values.size)
    tree.set(np.arange(values.size), values)
    return tree


# -- totals -----------------------------------------------------------------------------------

@pytest.mark.parametrize("capacity", [1, 2, 3, 5, 8, 1000, 1025])
def test_total_is_the_sum_of_the_leaves(capacity: int):
    values = np.arange(1, capacity + 1, dtype=np.float64)
    tree = filled(values)
    assert tree.total == values.sum()
    np.testing.assert_array_equal(tree.get(np.arange(capacity)), values)
    assert_consistent(tree)


def test_totals_follow_random_updates():
    rng = np.random.default_rng(3)
    capacity = 777
    tree, model = SumTree(capacity), np.zeros(capacity)
    for _ in range(200):
        slots = rng.integers(capacity, size=int(rng.integers(1, 50)))
        values = rng.integers(0, 100, size=slots.size).astype(np.float64)
        tree.set(slots, values)
        model[slots] = values
    np.testing.assert_array_equal(leaves(tree), model)
    assert tree.total == model.sum()
    assert_consistent(tree)


@pytest.mark.parametrize("capacity", [1, 2, 7, 64, 1000])
def test_runs_of_slots_and_scattered_slots_build_the_same_tree(capacity: int):
    """An inserted chunk sets one run of slots (refreshed level by level with slices); the
    result is the tree that setting the same slots one by one builds."""
    rng = np.random.default_rng(capacity)
    runs, singles, model = SumTree(capacity), SumTree(capacity), np.zeros(capacity)
    mins, min_model = MinTree(capacity), np.full(capacity, np.inf)
    for _ in range(100):
        start = int(rng.integers(capacity))
        stop = int(rng.integers(start, capacity)) + 1
        values = rng.integers(0, 50, size=stop - start).astype(np.float64)
        runs.set(np.arange(start, stop), values)
        mins.set(np.arange(start, stop), values)
        for slot, value in zip(range(start, stop), values, strict=True):
            singles.set(np.array([slot]), np.array([value]))
        model[start:stop] = values
        min_model[start:stop] = values
        np.testing.assert_array_equal(runs.tree, singles.tree)
        assert runs.total == model.sum() and mins.min == min_model.min()
    assert_consistent(runs)


def test_empty_tree_and_empty_update():
    tree = SumTree(10)
    assert tree.total == 0.0
    tree.set(np.array([], dtype=np.int64), np.array([]))
    assert tree.total == 0.0


# -- find -------------------------------------------------------------------------------------

def test_find_at_interval_edges():
    tree = filled([1, 2, 3, 4])  # intervals [0,1) [1,3) [3,6) [6,10)
    mass = np.array([0.0, np.nextafter(1.0, 0), 1.0, np.nextafter(3.0, 0), 3.0, 5.5, 6.0,
                     np.nextafter(10.0, 0)])
    np.testing.assert_array_equal(tree.find(mass), [0, 0, 1, 1, 2, 2, 3, 3])


@pytest.mark.parametrize("capacity", [3, 5, 6, 7, 100, 1000, 1023, 1025])
def test_find_matches_the_reference_when_capacity_is_not_a_power_of_two(capacity: int):
    rng = np.random.default_rng(capacity)
    values = rng.integers(1, 20, size=capacity).astype(np.float64)
    tree = filled(values)
    cum = np.cumsum(values)
    edges = np.concatenate([[0.0], cum[:-1]])
    mass = np.concatenate([edges, np.nextafter(cum, 0), rng.random(5000) * cum[-1]])
    found = tree.find(mass)
    np.testing.assert_array_equal(found, reference_find(values, mass))
    assert found.max() < capacity  # never a padding leaf


def test_find_never_chooses_a_zero_priority_leaf():
    values = np.array([0, 0, 3, 0, 1, 0, 0, 2, 0, 0], dtype=np.float64)  # capacity 10
    tree = filled(values)
    cum = np.cumsum(values)
    mass = np.concatenate([[0.0], cum[cum < tree.total], np.nextafter(cum[cum > 0], 0),
                           np.linspace(0, np.nextafter(tree.total, 0), 1001)])
    found = tree.find(mass)
    assert (values[found] > 0).all()
    np.testing.assert_array_equal(found, reference_find(values, mass))


def test_find_never_chooses_a_zero_priority_leaf_under_round_off():
    """Priorities spanning many orders of magnitude make `mass - left_sum` round past the end
    of a right subtree; the descent must still stop at a leaf with mass. (Without the guard
    in `find`, this seed's 20,000 trees walk into zero leaves.)"""
    rng = np.random.default_rng(0)
    for _ in range(5000):
        capacity = int(rng.integers(2, 40))
        values = rng.random(capacity) * 10.0 ** rng.integers(-8, 8, capacity)
        values[rng.random(capacity) < 0.4] = 0.0
        if not values.any():
            continue
        tree = filled(values)
        cum = np.cumsum(values)
        mass = np.concatenate([[np.nextafter(tree.total, 0)], np.nextafter(cum, 0), cum])
        mass = mass[(mass >= 0) & (mass < tree.total)]
        assert (values[tree.find(mass)] > 0).all(), values.tolist()


def test_find_with_capacity_one():
    tree = SumTree(1)
    tree.set(np.array([0]), np.array([2.5]))
    assert tree.total == 2.5
    np.testing.assert_array_equal(tree.find(np.array([0.0, 1.0, np.nextafter(2.5, 0)])),
                                  [0, 0, 0])
    tree.set(np.array([0]), np.array([0.5]))
    assert tree.total == 0.5


def test_find_keeps_the_shape_of_its_input():
    tree = filled([1, 1, 1, 1])
    assert tree.find(np.array([[0.5, 1.5], [2.5, 3.5]])).tolist() == [[0, 1], [2, 3]]


def test_find_frequencies_follow_the_leaves():
    """Uniform masses land on each slot in proportion to its value (a sanity check of the
    walk; the statistical test of the buffer is in test_prioritized.py)."""
    values = np.array([1, 0, 2, 0, 0, 7], dtype=np.float64)
    tree = filled(values)
    mass = (np.arange(100_000) + 0.5) / 100_000 * tree.total
    counts = np.bincount(tree.find(mass), minlength=values.size)
    np.testing.assert_array_equal(counts, [10_000, 0, 20_000, 0, 0, 70_000])


# -- set --------------------------------------------------------------------------------------

def test_set_with_duplicate_slots_last_wins():
    tree = filled([1, 1, 1, 1, 1])
    tree.set(np.array([2, 4, 2, 2, 4]), np.array([9.0, 8.0, 5.0, 3.0, 0.0]))
    np.testing.assert_array_equal(leaves(tree), [1, 1, 3, 1, 0])
    assert tree.total == 6.0
    assert_consistent(tree)

    mins = MinTree(5)
    mins.set(np.arange(5), np.ones(5) * 4)
    mins.set(np.array([1, 1, 1]), np.array([0.5, 7.0, 2.0]))
    np.testing.assert_array_equal(leaves(mins), [4, 2, 4, 4, 4])
    assert mins.min == 2.0


@pytest.mark.parametrize("bad", [-1.0, np.nan, np.inf, -np.inf])
def test_invalid_priorities_are_rejected_and_change_nothing(bad: float):
    tree = filled([1, 2, 3])
    before = tree.tree.copy()
    with pytest.raises(ValueError, match="finite and non-negative"):
        tree.set(np.array([0, 1]), np.array([5.0, bad]))
    np.testing.assert_array_equal(tree.tree, before)

    mins = MinTree(3)
    mins.set(np.arange(3), np.array([1.0, 2.0, 3.0]))
    before = mins.tree.copy()
    if bad == np.inf:  # +inf is how a min tree marks a slot that bounds nothing
        mins.set(np.array([0]), np.array([bad]))
        assert mins.min == 2.0
        return
    with pytest.raises(ValueError, match="non-negative"):
        mins.set(np.array([0, 1]), np.array([5.0, bad]))
    np.testing.assert_array_equal(mins.tree, before)


def test_capacity_must_be_positive():
    with pytest.raises(ValueError, match="capacity=0"):
        SumTree(0)
    with pytest.raises(ValueError, match="capacity=0"):
        MinTree(0)


# -- min --------------------------------------------------------------------------------------

def test_min_tree_is_infinite_when_empty_and_ignores_unset_slots():
    mins = MinTree(6)
    assert mins.min == np.inf
    mins.set(np.array([4]), np.array([3.0]))
    assert mins.min == 3.0


def test_min_tracks_updates():
    mins = MinTree(7)
    mins.set(np.arange(7), np.array([5, 4, 3, 2, 6, 7, 8], dtype=np.float64))
    assert mins.min == 2.0
    mins.set(np.array([3]), np.array([10.0]))  # the minimum grows: the next smallest takes over
    assert mins.min == 3.0
    mins.set(np.array([6]), np.array([0.25]))
    assert mins.min == 0.25
    mins.set(np.array([6, 2]), np.array([9.0, 9.0]))
    assert mins.min == 4.0


@pytest.mark.parametrize("capacity", [1, 2, 5, 64, 1000])
def test_min_matches_the_leaves_after_random_updates(capacity: int):
    rng = np.random.default_rng(capacity)
    mins, model = MinTree(capacity), np.full(capacity, np.inf)
    for _ in range(300):
        slots = rng.integers(capacity, size=int(rng.integers(1, 8)))
        values = rng.random(slots.size) * 100
        mins.set(slots, values)
        model[slots] = values
        assert mins.min == model.min()
    internal = np.arange(1, mins.size)
    np.testing.assert_array_equal(
        mins.tree[internal], np.minimum(mins.tree[2 * internal], mins.tree[2 * internal + 1]))
