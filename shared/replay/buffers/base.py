"""What every replay buffer shares: the item ring, chunk reference counts, monitors, snapshots.

A buffer is an index over experience that lives in storage. Its *items* are transitions
(uniform, prioritized), sequences inside episode segments (episode, sequence) or whole chunks
(queue); every item points into a chunk by (chunk, row). Items get a unique, ever-increasing
id (`uid`); ring buffers put item `uid` in slot `uid % capacity`, so a priority update names
its item by uid and is ignored when that slot has since been refilled.

A chunk may be referenced by several items and by several buffers; a buffer reports the chunk
ids it no longer refers to (`released`), and the coordinator's `ChunkRegistry` deletes a chunk
from storage once no buffer refers to it.
"""

from __future__ import annotations

import json
import threading
import time
from abc import ABC, abstractmethod
from collections import Counter, deque
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class ChunkInfo:
    """What a buffer needs to know about a chunk to index it (from its metadata)."""

    chunk_id: str
    length: int
    policy_version: int
    segments: tuple[tuple[int, int], ...] = ()  # (start row, length) runs within one episode


@dataclass
class SampleRefs:
    """References for `num_batches` batches of `batch_size` items.

    `chunk_ids` are distinct (the coordinator's answer takes one part's list as it is);
    `chunk_index[b, i]` indexes `chunk_ids`; `rows[b, i]` is the row (the first row of a
    sequence when `sequence_length` is set); `item_ids` name items for priority updates;
    `weights` are importance-sampling weights (prioritized and sequence buffers only);
    `lengths[k]` is the length of `chunk_ids[k]` when items are whole chunks (queue buffers
    only).
    """

    chunk_ids: list[str]
    chunk_index: np.ndarray
    rows: np.ndarray
    item_ids: np.ndarray
    weights: np.ndarray | None = None
    sequence_length: int | None = None
    lengths: np.ndarray | None = None


_AVERAGES = {"staleness_sum": float, "staleness_count": int, "lag_sum": float, "lag_count": int}


class SampleError(ValueError):
    """A sample request this buffer cannot serve (empty, too few items, bad size)."""


@dataclass
class Monitor:
    """Counters behind the `buffer/...` metrics."""

    inserted_items: int = 0
    inserted_chunks: int = 0
    sampled_items: int = 0
    evicted_items: int = 0
    released_chunks: int = 0
    dropped: Counter = field(default_factory=Counter)
    priority_updates: int = 0
    stale_priority_updates: int = 0
    staleness_sum: float = 0.0
    staleness_count: int = 0
    lag_sum: float = 0.0
    lag_count: int = 0
    _window: deque = field(default_factory=lambda: deque(maxlen=120))

    @property
    def usable_items(self) -> int:
        """Items inserted minus those dropped unused (overflow, policy lag, too short):
        what a rate limiter balances samples against, since dropped items can never be
        sampled and must not hold inserts back for ever."""
        return self.inserted_items - sum(self.dropped.values())

    def tick(self) -> None:
        self._window.append((time.monotonic(), self.inserted_items, self.sampled_items))

    def rates(self) -> tuple[float, float]:
        if len(self._window) < 2:
            return 0.0, 0.0
        (t0, i0, s0), (t1, i1, s1) = self._window[0], self._window[-1]
        dt = max(t1 - t0, 1e-9)
        return (i1 - i0) / dt, (s1 - s0) / dt


class Buffer(ABC):
    """The interface the coordinator talks to. Implementations are not thread-safe on their
    own; `lock` is held by the caller (the coordinator) around every call."""

    kind: str

    def __init__(self, name: str, capacity: int, seed: int) -> None:
        if capacity < 1:
            raise ValueError(f"buffers.{name}.capacity={capacity} must be at least 1")
        self.name = name
        self.capacity = capacity
        self.rng = np.random.default_rng(seed)
        self.monitor = Monitor()
        self.lock = threading.RLock()
        # Why chunks this buffer let go of were released, for the ledger: "consumed" or
        # "dropped/<reason>"; absent means "evicted". The replay pops them as it settles.
        self.release_reasons: dict[str, str] = {}

    @abstractmethod
    def __len__(self) -> int:
        """Items held."""

    @abstractmethod
    def insert(self, chunks: list[ChunkInfo], train_iteration: int) -> list[str]:
        """Index new chunks; returns the chunk ids this buffer no longer refers to."""

    @abstractmethod
    def sample(self, batch_size: int, num_batches: int, train_iteration: int,
               policy_version: int) -> SampleRefs:
        ...

    def update_priorities(self, item_ids: np.ndarray, priorities: np.ndarray) -> int:
        """Returns how many updates applied (stale ones are ignored). Non-prioritized
        buffers ignore priorities."""
        return 0

    def consume(self, chunk_ids: list[str], queued_too: bool = False) -> list[str]:
        """Chunks a learner reports as used up (queue buffers); returns released ids.
        `queued_too`: a journalled consumption replayed after a restart, when the restored
        buffer holds the chunks queued again."""
        return []

    @abstractmethod
    def chunk_ids(self) -> set[str]:
        """Every chunk id some item of this buffer refers to."""

    @abstractmethod
    def snapshot(self) -> tuple[dict[str, np.ndarray], dict[str, str]]:
        """The index as arrays plus string metadata (safetensors-ready)."""

    @abstractmethod
    def restore(self, arrays: dict[str, np.ndarray], meta: dict[str, str]) -> None:
        ...

    def chunk_occurrences(self) -> list[str]:
        """Every chunk id this buffer indexes, once per index entry: a chunk indexed twice
        would appear twice (the ledger checks that none does)."""
        return sorted(self.chunk_ids())

    def use_counts(self) -> np.ndarray:
        return np.zeros(0, dtype=np.int64)

    def stats(self) -> dict[str, float]:
        m = self.monitor
        inserts_per_s, samples_per_s = m.rates()
        uses = self.use_counts()
        out = {
            "size": float(len(self)),
            "capacity": float(self.capacity),
            "inserted_items": float(m.inserted_items),
            "inserted_chunks": float(m.inserted_chunks),
            "sampled_items": float(m.sampled_items),
            "evicted_items": float(m.evicted_items),
            "released_chunks": float(m.released_chunks),
            "inserts_per_s": inserts_per_s,
            "samples_per_s": samples_per_s,
            "use_count_mean": float(uses.mean()) if uses.size else 0.0,
            "use_count_max": float(uses.max()) if uses.size else 0.0,
            "staleness_mean": m.staleness_sum / m.staleness_count if m.staleness_count else 0.0,
            "policy_lag_mean": m.lag_sum / m.lag_count if m.lag_count else 0.0,
            "priority_updates": float(m.priority_updates),
            "stale_priority_updates": float(m.stale_priority_updates),
            "dropped_items": float(sum(m.dropped.values())),
        }
        for reason, n in m.dropped.items():
            out[f"dropped/{reason}"] = float(n)
        return out

    def snapshot_meta(self, **extra: str) -> dict[str, str]:
        """The header every snapshot carries: what kind of buffer it is, then counters."""
        return {"kind": self.kind, "name": self.name, "capacity": str(self.capacity),
                **extra, **self.monitor_snapshot()}

    def check_snapshot(self, meta: dict[str, str], **extra: str) -> None:
        """Refuse a snapshot taken of a differently shaped buffer."""
        expected = {"kind": self.kind, "capacity": str(self.capacity), **extra}
        found = {key: meta.get(key) for key in expected}
        if found != expected:
            raise ValueError(f"snapshot of a buffer with {found} cannot restore "
                             f"buffers.{self.name} ({expected})")

    def monitor_snapshot(self) -> dict[str, str]:
        """Counters, running averages and the random generator's state, as header strings."""
        m = self.monitor
        return {"rng_state": json.dumps(self.rng.bit_generator.state),
                **{key: repr(getattr(m, key)) for key in _AVERAGES},
                "inserted_items": str(m.inserted_items), "inserted_chunks": str(m.inserted_chunks),
                "sampled_items": str(m.sampled_items), "evicted_items": str(m.evicted_items),
                "released_chunks": str(m.released_chunks),
                "priority_updates": str(m.priority_updates),
                "stale_priority_updates": str(m.stale_priority_updates),
                "dropped": ";".join(f"{k}={v}" for k, v in m.dropped.items())}

    def monitor_restore(self, meta: dict[str, str]) -> None:
        m = self.monitor
        for key in ("inserted_items", "inserted_chunks", "sampled_items", "evicted_items",
                    "released_chunks", "priority_updates", "stale_priority_updates"):
            setattr(m, key, int(meta.get(key, "0")))
        m.dropped = Counter()
        for part in filter(None, meta.get("dropped", "").split(";")):
            k, v = part.split("=")
            m.dropped[k] = int(v)
        for key, cast in _AVERAGES.items():
            setattr(m, key, cast(meta.get(key, "0")))
        if "rng_state" in meta:
            self.rng.bit_generator.state = json.loads(meta["rng_state"])


class ChunkTable:
    """Chunk ids as small integers (so item arrays stay numeric), with reference counts."""

    def __init__(self) -> None:
        self.ids: list[str | None] = []
        self.refs: list[int] = []
        self.index: dict[str, int] = {}
        self._free: list[int] = []

    def __len__(self) -> int:
        return len(self.index)

    def __contains__(self, chunk_id: str) -> bool:
        return chunk_id in self.index

    def add(self, chunk_id: str, refs: int) -> int:
        if self._free:
            i = self._free.pop()
            self.ids[i], self.refs[i] = chunk_id, refs
        else:
            i = len(self.ids)
            self.ids.append(chunk_id)
            self.refs.append(refs)
        self.index[chunk_id] = i
        return i

    def release(self, indices: np.ndarray) -> list[str]:
        """Drop one reference per occurrence; returns ids whose count reached zero."""
        released: list[str] = []
        if indices.size == 0:
            return released
        uniq, counts = np.unique(indices, return_counts=True)
        for i, n in zip(uniq.tolist(), counts.tolist(), strict=True):
            self.refs[i] -= n
            if self.refs[i] <= 0:
                chunk_id = self.ids[i]
                assert chunk_id is not None
                released.append(chunk_id)
                del self.index[chunk_id]
                self.ids[i] = None
                self.refs[i] = 0
                self._free.append(i)
        return released

    def names(self, indices: np.ndarray) -> list[str]:
        return [self.ids[i] for i in indices.tolist()]

    def snapshot(self) -> tuple[list[str], np.ndarray]:
        """(ids of live entries, their table index)."""
        live = [(i, c) for i, c in enumerate(self.ids) if c is not None]
        return [c for _, c in live], np.array([i for i, _ in live], dtype=np.int64)
