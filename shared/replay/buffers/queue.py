"""Queue buffer for on-policy learning: whole chunks, first in first out, each used once.

A learner polls `sample(..., num_batches=k)` and gets up to k whole chunks, oldest first;
`batch_size` is ignored (a learner cuts its own minibatches from the chunks it reads). A
handed-out chunk is *in flight* until the learner reports it used (`consume`, which releases
it) or until the coordinator gives it back (`requeue`, for a learner that died: the chunks go
back to the head of the queue). Nothing is handed out twice unless it was requeued. The
coordinator journals each consumption before making it, so a coordinator that crashes after
a snapshot does not hand out again what was consumed since (`consume(..., queued_too=True)`).

Data that is not used is counted in `dropped` (in transitions) and released:
- `dropped["overflow"]`: `capacity` bounds the transitions queued (not those in flight); the
  oldest chunks go first, never the newest one;
- `dropped["policy_lag"]`: before handing out, every queued chunk whose policy lag (the
  learner's policy version minus the chunk's) exceeds `max_policy_lag` is dropped.

Chunks dropped inside `sample` (policy lag) cannot be returned by it: they wait in a list
that `take_released()` empties, and that the next `insert` or `consume` also empties into
its return value, so the coordinator learns about them either way.

Item ids are per-chunk uids, in insertion order. Counters are in transitions:
`sampled_items` counts the rows of chunks handed out (again if handed out after a requeue);
`consumed_chunks`/`consumed_items` what learners reported used; `evicted_items` stays 0
(whatever leaves unused is in `dropped/<reason>`).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from rlfleet.shared.replay.buffers.base import Buffer, ChunkInfo, Monitor, SampleError, SampleRefs
from rlfleet.shared.replay.buffers.ring import _pack_ids, _unpack_ids

_QUEUE_COUNTERS = ("consumed_chunks", "consumed_items", "requeued_chunks")


@dataclass
class QueueMonitor(Monitor):
    consumed_chunks: int = 0
    consumed_items: int = 0
    requeued_chunks: int = 0


@dataclass(frozen=True, slots=True)
class _Entry:
    chunk_id: str
    length: int
    policy_version: int
    inserted_at: int  # train iteration
    uid: int


class QueueBuffer(Buffer):
    """FIFO of whole chunks, each handed out once; see the module docstring."""

    kind = "queue"

    def __init__(self, name: str, capacity: int, seed: int,
                 max_policy_lag: int | None = None) -> None:
        super().__init__(name, capacity, seed)
        if max_policy_lag is not None and max_policy_lag < 0:
            raise ValueError(f"buffers.{name}.max_policy_lag={max_policy_lag} must be at "
                             "least 0 (or None: no bound)")
        self.max_policy_lag = max_policy_lag
        self.monitor: QueueMonitor = QueueMonitor()
        self.queue: OrderedDict[str, _Entry] = OrderedDict()  # oldest first
        self.in_flight: dict[str, _Entry] = {}
        self.queued_items = 0
        self.next_uid = 0
        self._released: list[str] = []  # released outside insert/consume, not yet reported

    def __len__(self) -> int:
        """Transitions queued (in-flight chunks are not counted)."""
        return self.queued_items

    def chunk_ids(self) -> set[str]:
        return set(self.queue) | set(self.in_flight)

    def chunk_occurrences(self) -> list[str]:
        return [*self.queue, *self.in_flight]

    def stats(self) -> dict[str, float]:
        out = super().stats()
        m = self.monitor
        out.update(queued_chunks=float(len(self.queue)),
                   in_flight_chunks=float(len(self.in_flight)),
                   in_flight_items=float(sum(e.length for e in self.in_flight.values())),
                   **{key: float(getattr(m, key)) for key in _QUEUE_COUNTERS})
        return out

    # -- releasing --------------------------------------------------------------------------

    def _release(self, entry: _Entry, reason: str) -> None:
        self._released.append(entry.chunk_id)
        self.release_reasons[entry.chunk_id] = reason
        self.monitor.released_chunks += 1

    def _drop(self, entry: _Entry, reason: str) -> None:
        """Let go of a queued chunk that was never used."""
        del self.queue[entry.chunk_id]
        self.queued_items -= entry.length
        self.monitor.dropped[reason] += entry.length
        self._release(entry, f"dropped/{reason}")

    def take_released(self) -> list[str]:
        """Chunk ids released since the last call (or the last insert/consume) and not yet
        reported: those dropped for policy lag while sampling."""
        out, self._released = self._released, []
        return out

    # -- inserting --------------------------------------------------------------------------

    def insert(self, chunks: list[ChunkInfo], train_iteration: int) -> list[str]:
        for info in chunks:
            if info.length < 0:
                raise ValueError(f"chunk {info.chunk_id}: length={info.length} is negative")
        m = self.monitor
        for info in chunks:
            if info.chunk_id in self.queue or info.chunk_id in self.in_flight:
                continue  # a retried report: already held
            self.queue[info.chunk_id] = _Entry(info.chunk_id, info.length, info.policy_version,
                                               train_iteration, self.next_uid)
            self.next_uid += 1
            self.queued_items += info.length
            m.inserted_items += info.length
            m.inserted_chunks += 1
        while self.queued_items > self.capacity and len(self.queue) > 1:
            self._drop(next(iter(self.queue.values())), "overflow")
        return self.take_released()

    # -- handing out ------------------------------------------------------------------------

    def sample(self, batch_size: int, num_batches: int, train_iteration: int,
               policy_version: int) -> SampleRefs:
        """Up to `num_batches` whole chunks, oldest first (`batch_size` is ignored); none
        when the queue is empty."""
        if num_batches < 1:
            raise SampleError(f"num_batches={num_batches} must be at least 1")
        if self.max_policy_lag is not None and policy_version >= 0:
            stale = [e for e in self.queue.values()
                     if policy_version - e.policy_version > self.max_policy_lag]
            for entry in stale:
                self._drop(entry, "policy_lag")
        taken: list[_Entry] = []
        while self.queue and len(taken) < num_batches:
            _, entry = self.queue.popitem(last=False)
            self.in_flight[entry.chunk_id] = entry
            self.queued_items -= entry.length
            taken.append(entry)
        lengths = np.array([e.length for e in taken], dtype=np.int64)
        m = self.monitor
        if taken:  # staleness and lag per transition, as in the transition buffers
            m.sampled_items += int(lengths.sum())
            inserted_at = np.array([e.inserted_at for e in taken], dtype=np.int64)
            m.staleness_sum += float(((train_iteration - inserted_at) * lengths).sum())
            m.staleness_count += int(lengths.sum())
            if policy_version >= 0:
                versions = np.array([e.policy_version for e in taken], dtype=np.int64)
                m.lag_sum += float(((policy_version - versions).clip(min=0) * lengths).sum())
                m.lag_count += int(lengths.sum())
        k = len(taken)
        return SampleRefs(
            chunk_ids=[e.chunk_id for e in taken],
            chunk_index=np.arange(k, dtype=np.int64).reshape(k, 1),
            rows=np.zeros((k, 1), dtype=np.int64),
            item_ids=np.array([e.uid for e in taken], dtype=np.int64).reshape(k, 1),
            lengths=lengths)

    def consume(self, chunk_ids: list[str], queued_too: bool = False) -> list[str]:
        """In-flight chunks a learner reports used: released (plus any still unreported).
        Ids not in flight (a retried report) are ignored, unless `queued_too`: a restored
        queue holds what was in flight queued at its head, and a journalled consumption
        replayed after a crash takes those out, so they are not handed out twice."""
        m = self.monitor
        for chunk_id in chunk_ids:
            entry = self.in_flight.pop(chunk_id, None)
            if entry is None and queued_too:
                entry = self.queue.pop(chunk_id, None)
                if entry is not None:  # handed out after the snapshot, before the crash
                    self.queued_items -= entry.length
                    m.sampled_items += entry.length
            if entry is None:
                continue
            m.consumed_chunks += 1
            m.consumed_items += entry.length
            self._release(entry, "consumed")
        return self.take_released()

    def requeue(self, chunk_ids: list[str]) -> int:
        """Put in-flight chunks back at the head of the queue (in their original order), for
        a learner that will not consume them; returns how many went back."""
        back = sorted((self.in_flight.pop(c) for c in dict.fromkeys(chunk_ids)
                       if c in self.in_flight), key=lambda e: e.uid)
        for entry in reversed(back):
            self.queue[entry.chunk_id] = entry
            self.queue.move_to_end(entry.chunk_id, last=False)
            self.queued_items += entry.length
        self.monitor.requeued_chunks += len(back)
        return len(back)

    # -- snapshots --------------------------------------------------------------------------

    def monitor_snapshot(self) -> dict[str, str]:
        """In-flight chunks are saved as queued (see `snapshot`), so their handing out is
        taken back from `sampled_items` too: a restored rate limiter must not count samples
        that the restored queue will hand out again, nor miss those a replayed consumption
        takes out of it (which `consume(queued_too=True)` counts)."""
        m = self.monitor
        in_flight = sum(e.length for e in self.in_flight.values())
        return {**super().monitor_snapshot(),
                "sampled_items": str(m.sampled_items - in_flight),
                **{key: str(getattr(m, key)) for key in _QUEUE_COUNTERS}}

    def monitor_restore(self, meta: dict[str, str]) -> None:
        super().monitor_restore(meta)
        for key in _QUEUE_COUNTERS:
            setattr(self.monitor, key, int(meta.get(key, "0")))

    def snapshot(self) -> tuple[dict[str, np.ndarray], dict[str, str]]:
        """In-flight chunks are saved first, as if queued at the head: a restored buffer
        hands them out again, so nothing handed out but not consumed is lost."""
        entries = sorted(self.in_flight.values(), key=lambda e: e.uid) + list(self.queue.values())
        arrays = {"chunk_ids": _pack_ids([e.chunk_id for e in entries]),
                  "released": _pack_ids(self._released)}
        for key in ("length", "policy_version", "inserted_at", "uid"):
            arrays[key] = np.array([getattr(e, key) for e in entries], dtype=np.int64)
        return arrays, self.snapshot_meta(next_uid=str(self.next_uid))

    def restore(self, arrays: dict[str, np.ndarray], meta: dict[str, str]) -> None:
        self.check_snapshot(meta)
        columns = [arrays[key].tolist() for key in ("length", "policy_version", "inserted_at",
                                                     "uid")]
        ids = _unpack_ids(arrays["chunk_ids"])
        self.queue = OrderedDict(
            (chunk_id, _Entry(chunk_id, *values))
            for chunk_id, *values in zip(ids, *columns, strict=True))
        self.in_flight = {}
        self.queued_items = sum(e.length for e in self.queue.values())
        self.next_uid = int(meta["next_uid"])
        self._released = _unpack_ids(arrays["released"])
        self.monitor = QueueMonitor()
        self.monitor_restore(meta)
