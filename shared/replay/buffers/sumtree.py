"""Sum and min segment trees over a fixed number of slots, vectorised over batches.

Prioritized replay needs three things fast on a million items: draw many slots in proportion
to their priority, update many priorities, and know the smallest priority (for the largest
importance weight). A flat array tree does each with one numpy operation per tree level
(about 20 levels for 1M slots), whatever the batch size: no Python loop over items.
"""

from __future__ import annotations

import numpy as np


def _refresh(tree: np.ndarray, leaves: np.ndarray, combine: np.ufunc) -> None:
    """Recompute every ancestor of the given leaf nodes, one level per step up to the root.

    The nodes are sorted once; shifting right keeps them sorted, so each level drops its
    duplicates with one comparison of neighbours (np.unique per level would sort or hash every
    level again, most of the cost of a priority update)."""
    nodes = np.sort(leaves) >> 1
    lo, hi = int(nodes[0]), int(nodes[-1])
    if hi - lo + 1 <= nodes.size and lo >= 1 and np.all(np.diff(nodes) <= 1):
        # one run of slots (an inserted chunk): every level is a run too, and slices are
        # several times cheaper than gathers and scatters
        while True:
            tree[lo:hi + 1] = combine(tree[2 * lo:2 * hi + 2:2], tree[2 * lo + 1:2 * hi + 2:2])
            if lo == 1:
                return
            lo, hi = lo >> 1, hi >> 1
    keep = np.empty(nodes.size, dtype=bool)
    while nodes[-1] >= 1:  # with one slot the leaf is the root: nothing above it
        if nodes.size > 1:
            keep = keep[:nodes.size]
            keep[0] = True
            np.not_equal(nodes[1:], nodes[:-1], out=keep[1:])
            nodes = nodes[keep]
        left = 2 * nodes
        tree[nodes] = combine(tree[left], tree[left + 1])
        if nodes[0] == 1:
            return
        nodes >>= 1


class SumTree:
    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity={capacity} must be at least 1")
        self.capacity = capacity
        self.size = 1 << max(0, int(np.ceil(np.log2(capacity))))  # leaves, a power of two
        self.tree = np.zeros(2 * self.size, dtype=np.float64)    # node i: children 2i, 2i+1
        self.depth = self.size.bit_length() - 1

    @property
    def total(self) -> float:
        return float(self.tree[1])

    def get(self, slots: np.ndarray) -> np.ndarray:
        return self.tree[self.size + np.asarray(slots)]

    def set(self, slots: np.ndarray, values: np.ndarray) -> None:
        """Set leaves (later duplicates win), then recompute every affected ancestor."""
        slots = np.asarray(slots, dtype=np.int64)
        values = np.asarray(values, dtype=np.float64)
        if slots.size == 0:
            return
        if (values < 0).any() or not np.isfinite(values).all():
            raise ValueError("priorities must be finite and non-negative")
        nodes = slots + self.size
        self.tree[nodes] = values
        _refresh(self.tree, nodes, np.add)

    def find(self, mass: np.ndarray) -> np.ndarray:
        """For each value in [0, total), the slot whose cumulative-priority interval holds it."""
        mass = np.array(mass, dtype=np.float64, copy=True)
        nodes = np.ones(mass.shape, dtype=np.int64)
        for _ in range(self.depth):
            left = 2 * nodes
            left_sum = self.tree[left]
            # Never step into a subtree with no mass: round-off in `mass - left_sum` can
            # leave a draw at or past the end of the right subtree, and it would then walk to
            # that subtree's last leaf even when that leaf's priority is zero.
            go_right = (mass >= left_sum) & (self.tree[left + 1] > 0)
            mass -= np.where(go_right, left_sum, 0.0)
            nodes = left + go_right
        slots = nodes - self.size
        return np.minimum(slots, self.capacity - 1)


class MinTree:
    """Unset slots hold +inf, which never bounds the minimum (setting +inf clears a slot)."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity={capacity} must be at least 1")
        self.capacity = capacity
        self.size = 1 << max(0, int(np.ceil(np.log2(capacity))))
        self.tree = np.full(2 * self.size, np.inf, dtype=np.float64)

    @property
    def min(self) -> float:
        return float(self.tree[1])

    def set(self, slots: np.ndarray, values: np.ndarray) -> None:
        slots = np.asarray(slots, dtype=np.int64)
        values = np.asarray(values, dtype=np.float64)
        if slots.size == 0:
            return
        if (values < 0).any() or np.isnan(values).any():
            raise ValueError("priorities must be non-negative numbers (+inf clears a slot)")
        nodes = slots + self.size
        self.tree[nodes] = values
        _refresh(self.tree, nodes, np.minimum)
