"""Transition buffers on a ring of slots: uniform and prioritized.

Item `uid` lives in slot `uid % capacity`; the ring overwrites its oldest items first, and a
chunk is released once its last item is overwritten. All per-item state is in numpy arrays,
so inserting, sampling and updating are a handful of vectorised operations per call.
"""

from __future__ import annotations

import numpy as np

from rlfleet.shared.replay.buffers.base import (
    Buffer,
    ChunkInfo,
    ChunkTable,
    SampleError,
    SampleRefs,
)
from rlfleet.shared.replay.buffers.sumtree import MinTree, SumTree


def _pack_ids(ids: list[str]) -> np.ndarray:
    return np.frombuffer("\n".join(ids).encode(), dtype=np.uint8).copy()


def _unpack_ids(arr: np.ndarray) -> list[str]:
    text = arr.tobytes().decode()
    return text.split("\n") if text else []


def _drawable(scaled: np.ndarray) -> np.ndarray:
    """Min-tree values: an item of priority zero is never drawn, so it does not bound the
    importance weights (with `priority_eps=0` it would make the largest weight infinite)."""
    return np.where(scaled > 0, scaled, np.inf)


class TransitionRing(Buffer):
    def __init__(self, name: str, capacity: int, seed: int) -> None:
        super().__init__(name, capacity, seed)
        self.table = ChunkTable()
        self.uid = np.full(capacity, -1, dtype=np.int64)
        self.chunk = np.zeros(capacity, dtype=np.int32)
        self.row = np.zeros(capacity, dtype=np.int32)
        self.inserted_at = np.zeros(capacity, dtype=np.int64)
        self.version = np.zeros(capacity, dtype=np.int64)
        self.uses = np.zeros(capacity, dtype=np.int32)
        self.next_uid = 0

    def __len__(self) -> int:
        return min(self.next_uid, self.capacity)

    def chunk_ids(self) -> set[str]:
        return set(self.table.index)

    def chunk_occurrences(self) -> list[str]:
        return [c for c in self.table.ids if c is not None]

    def use_counts(self) -> np.ndarray:
        return self.uses[: len(self)]

    # -- inserting --------------------------------------------------------------------------

    def insert(self, chunks: list[ChunkInfo], train_iteration: int) -> list[str]:
        released: list[str] = []
        for info in chunks:
            if info.chunk_id in self.table:
                continue  # a retried report: already indexed
            length = info.length
            rows = np.arange(length, dtype=np.int64)
            if length > self.capacity:  # only the newest `capacity` items fit
                skipped = length - self.capacity
                self.next_uid += skipped
                self.monitor.evicted_items += skipped
                rows = rows[skipped:]
                length = self.capacity
            uids = self.next_uid + np.arange(length, dtype=np.int64)
            slots = uids % self.capacity
            old = self.uid[slots] >= 0
            if old.any():
                self.monitor.evicted_items += int(old.sum())
                released += self.table.release(self.chunk[slots[old]])
            index = self.table.add(info.chunk_id, length)
            self.uid[slots] = uids
            self.chunk[slots] = index
            self.row[slots] = rows
            self.inserted_at[slots] = train_iteration
            self.version[slots] = info.policy_version
            self.uses[slots] = 0
            self._on_insert(slots)
            self.next_uid += length
            self.monitor.inserted_items += length
            self.monitor.inserted_chunks += 1
        self.monitor.released_chunks += len(released)
        return released

    def _on_insert(self, slots: np.ndarray) -> None:
        """Hook for per-slot state of subclasses (priorities)."""

    # -- sampling ---------------------------------------------------------------------------

    def _draw(self, n: int) -> tuple[np.ndarray, np.ndarray | None]:
        """n slots and (for prioritized buffers) their importance weights."""
        raise NotImplementedError

    def sample(self, batch_size: int, num_batches: int, train_iteration: int,
               policy_version: int) -> SampleRefs:
        if batch_size < 1 or num_batches < 1:
            raise SampleError(f"batch_size={batch_size} and num_batches={num_batches} must "
                              "be at least 1")
        if len(self) == 0:
            raise SampleError(f"buffer '{self.name}' is empty")
        n = batch_size * num_batches
        slots, weights = self._draw(n)
        # a scalar of the array's own dtype keeps np.add.at on its fast path (a Python int
        # takes its slow, per-element one)
        np.add.at(self.uses, slots, self.uses.dtype.type(1))
        m = self.monitor
        m.sampled_items += n
        m.staleness_sum += float((train_iteration - self.inserted_at[slots]).sum())
        m.staleness_count += n
        if policy_version >= 0:
            m.lag_sum += float((policy_version - self.version[slots]).clip(min=0).sum())
            m.lag_count += n
        # The table is small, so a presence map over it finds the sorted ids and positions
        # np.unique would, without sorting the sampled table indices.
        index = self.chunk[slots]
        present = np.zeros(len(self.table.ids), dtype=bool)
        present[index] = True
        uniq = np.flatnonzero(present)
        inverse = (np.cumsum(present) - 1)[index]
        shape = (num_batches, batch_size)
        return SampleRefs(
            chunk_ids=self.table.names(uniq), chunk_index=inverse.reshape(shape),
            rows=self.row[slots].reshape(shape), item_ids=self.uid[slots].reshape(shape),
            weights=None if weights is None else weights.reshape(shape))

    # -- snapshots --------------------------------------------------------------------------

    def snapshot(self) -> tuple[dict[str, np.ndarray], dict[str, str]]:
        ids, index = self.table.snapshot()
        arrays = {key: getattr(self, key).copy()  # copies: the caller may encode later
                  for key in ("uid", "chunk", "row", "inserted_at", "version", "uses")}
        arrays.update({
                  "table_ids": _pack_ids(ids), "table_index": index,
                  "table_refs": np.array([self.table.refs[i] for i in index.tolist()],
                                         dtype=np.int64)})
        return arrays, self.snapshot_meta(next_uid=str(self.next_uid))

    def restore(self, arrays: dict[str, np.ndarray], meta: dict[str, str]) -> None:
        self.check_snapshot(meta)
        for key in ("uid", "chunk", "row", "inserted_at", "version", "uses"):
            getattr(self, key)[:] = arrays[key]
        self.next_uid = int(meta["next_uid"])
        table = ChunkTable()
        ids = _unpack_ids(arrays["table_ids"])
        index, refs = arrays["table_index"].tolist(), arrays["table_refs"].tolist()
        size = (max(index) + 1) if index else 0
        table.ids = [None] * size
        table.refs = [0] * size
        for chunk_id, i, r in zip(ids, index, refs, strict=True):
            table.ids[i], table.refs[i] = chunk_id, r
            table.index[chunk_id] = i
        table._free = [i for i in range(size) if table.ids[i] is None]
        self.table = table
        self.monitor_restore(meta)


class UniformBuffer(TransitionRing):
    """Uniform over transitions; optionally only over the newest `sample_range` items, and
    optionally without replacement within one request."""

    kind = "uniform"

    def __init__(self, name: str, capacity: int, seed: int, replacement: bool = True,
                 sample_range: int | None = None) -> None:
        super().__init__(name, capacity, seed)
        self.replacement = replacement
        self.sample_range = sample_range

    def _draw(self, n: int) -> tuple[np.ndarray, None]:
        window = len(self) if self.sample_range is None else min(self.sample_range, len(self))
        if not self.replacement and n > window:
            raise SampleError(f"buffer '{self.name}' samples without replacement and holds "
                              f"{window} items in range, fewer than the {n} asked for")
        if self.replacement:
            offsets = self.rng.integers(window, size=n)
        else:
            offsets = self.rng.choice(window, size=n, replace=False)
        # offset 0 is the newest item
        return (self.next_uid - 1 - offsets) % self.capacity, None


class PrioritizedBuffer(TransitionRing):
    """Proportional prioritized replay (Schaul et al. 2016): P(i) = p_i^alpha / sum p^alpha,
    importance weights (N P(i))^-beta normalised by their maximum, beta annealed linearly
    from `beta` to `beta_final` over `beta_anneal_iterations` train iterations. New items get
    the largest priority seen so far, so each is likely to be replayed at least once."""

    kind = "prioritized"

    def __init__(self, name: str, capacity: int, seed: int, alpha: float = 0.6,
                 beta: float = 0.4, beta_final: float = 1.0,
                 beta_anneal_iterations: int = 100_000, priority_eps: float = 1e-6) -> None:
        super().__init__(name, capacity, seed)
        self.alpha, self.beta0, self.beta_final = alpha, beta, beta_final
        self.anneal = max(1, beta_anneal_iterations)
        self.eps = priority_eps
        self.sum = SumTree(capacity)
        self.min = MinTree(capacity)
        self.max_priority = 1.0
        self.train_iteration = 0

    def beta(self, train_iteration: int) -> float:
        frac = min(1.0, max(0, train_iteration) / self.anneal)
        return self.beta0 + frac * (self.beta_final - self.beta0)

    def _on_insert(self, slots: np.ndarray) -> None:
        value = np.full(slots.shape, self.max_priority ** self.alpha)
        self.sum.set(slots, value)
        self.min.set(slots, value)

    def sample(self, batch_size: int, num_batches: int, train_iteration: int,
               policy_version: int) -> SampleRefs:
        self.train_iteration = train_iteration
        return super().sample(batch_size, num_batches, train_iteration, policy_version)

    def _draw(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        total = self.sum.total
        if total <= 0:
            raise SampleError(f"buffer '{self.name}' has no item with positive priority")
        # Stratified: one draw in each of n equal slices of the priority mass.
        mass = (np.arange(n) + self.rng.random(n)) * (total / n)
        slots = self.sum.find(np.minimum(mass, np.nextafter(total, 0)))
        # The strata come out in slot order; shuffled, so that each batch of a multi-batch
        # request spans the whole buffer rather than one contiguous slice of it.
        slots = self.rng.permutation(slots)
        slots = np.minimum(slots, len(self) - 1)
        probs = self.sum.get(slots) / total
        size = len(self)
        beta = self.beta(self.train_iteration)
        p_min = self.min.min / total
        weights = (size * probs) ** (-beta) / (size * p_min) ** (-beta)
        return slots, weights.astype(np.float32)

    def update_priorities(self, item_ids: np.ndarray, priorities: np.ndarray) -> int:
        item_ids = np.asarray(item_ids, dtype=np.int64).reshape(-1)
        priorities = np.asarray(priorities, dtype=np.float64).reshape(-1)
        if item_ids.shape != priorities.shape:
            raise ValueError(f"{item_ids.size} item ids but {priorities.size} priorities")
        if not np.isfinite(priorities).all() or (priorities < 0).any():
            raise ValueError("priorities must be finite and non-negative")
        slots = item_ids % self.capacity
        live = (self.uid[slots] == item_ids) & (item_ids >= 0)
        self.monitor.priority_updates += int(live.sum())
        self.monitor.stale_priority_updates += int((~live).sum())
        if live.any():
            p = priorities[live] + self.eps
            self.max_priority = max(self.max_priority, float(p.max()))
            scaled = p ** self.alpha
            self.sum.set(slots[live], scaled)
            self.min.set(slots[live], _drawable(scaled))
        return int(live.sum())

    def snapshot(self) -> tuple[dict[str, np.ndarray], dict[str, str]]:
        arrays, meta = super().snapshot()
        arrays["priority"] = self.sum.tree[self.sum.size:self.sum.size + self.capacity].copy()
        meta["max_priority"] = repr(self.max_priority)
        meta["train_iteration"] = str(self.train_iteration)
        return arrays, meta

    def restore(self, arrays: dict[str, np.ndarray], meta: dict[str, str]) -> None:
        super().restore(arrays, meta)
        slots = np.arange(self.capacity)
        prio = arrays["priority"].astype(np.float64)
        self.sum = SumTree(self.capacity)
        self.min = MinTree(self.capacity)
        filled = slots[self.uid >= 0]
        self.sum.set(filled, prio[filled])
        self.min.set(filled, _drawable(prio[filled]))
        self.max_priority = float(meta["max_priority"])
        self.train_iteration = int(meta["train_iteration"])
