"""The uniform replay buffer: an index of chunks, never their payload.

Items are transitions addressed as (chunk, row). The buffer keeps chunks in insertion order
with their lengths, evicts whole chunks oldest-first once it holds more than `capacity`
transitions, and samples transitions uniformly with one vectorised draw per request.
Evicted chunk ids are handed back so the caller can delete them from storage.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Item:
    chunk_id: str
    length: int
    policy_version: int
    inserted_at: float


@dataclass
class SampleRefs:
    chunk_ids: list[str]
    chunk_index: np.ndarray  # (num_batches, batch_size) -> index into chunk_ids
    rows: np.ndarray         # (num_batches, batch_size)


class UniformBuffer:
    def __init__(self, capacity: int, seed: int = 0) -> None:
        if capacity < 1:
            raise ValueError(f"capacity={capacity} must be at least 1")
        self.capacity = capacity
        self._items: deque[Item] = deque()
        self._ids: set[str] = set()
        self._size = 0
        self._cum: np.ndarray | None = None
        self._rng = np.random.default_rng(seed)
        self._lock = threading.Lock()
        self.inserted_chunks = 0
        self.evicted_chunks = 0
        self.sampled_items = 0

    def __len__(self) -> int:
        return self._size

    @property
    def num_chunks(self) -> int:
        return len(self._items)

    def __contains__(self, chunk_id: str) -> bool:
        return chunk_id in self._ids

    def chunk_ids(self) -> list[str]:
        with self._lock:
            return [it.chunk_id for it in self._items]

    def insert(self, items: list[Item]) -> list[str]:
        """Add chunks (ids already present are ignored: a retried report must not count
        twice); returns the ids evicted to stay within capacity."""
        evicted: list[str] = []
        with self._lock:
            for it in items:
                if it.chunk_id in self._ids:
                    continue
                self._items.append(it)
                self._ids.add(it.chunk_id)
                self._size += it.length
                self.inserted_chunks += 1
            # Keep the newest chunk even if it alone exceeds capacity.
            while self._size > self.capacity and len(self._items) > 1:
                old = self._items.popleft()
                self._ids.discard(old.chunk_id)
                self._size -= old.length
                self.evicted_chunks += 1
                evicted.append(old.chunk_id)
            self._cum = None
        return evicted

    def sample(self, batch_size: int, num_batches: int) -> SampleRefs:
        """Uniform over transitions, with replacement."""
        with self._lock:
            if self._size == 0:
                raise ValueError("cannot sample from an empty buffer")
            if self._cum is None:
                self._cum = np.cumsum([it.length for it in self._items])
            cum = self._cum
            flat = self._rng.integers(self._size, size=num_batches * batch_size)
            pos = np.searchsorted(cum, flat, side="right")
            rows = flat - np.concatenate(([0], cum[:-1]))[pos]
            uniq, inverse = np.unique(pos, return_inverse=True)
            ids = [self._items[i].chunk_id for i in uniq]
            self.sampled_items += flat.size
        return SampleRefs(ids, inverse.reshape(num_batches, batch_size),
                          rows.reshape(num_batches, batch_size))
