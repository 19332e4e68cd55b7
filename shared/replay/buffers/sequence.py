"""Sequence buffer: fixed-length, overlapping, prioritized sequences inside one episode (R2D2).

As in the episode buffer, a chunk's rows are grouped per env trajectory and
`ChunkInfo.segments` names its runs of rows from one episode (none: the whole chunk is one
run). Here the items are not every valid start but a fixed tiling of each segment, as R2D2
stores its replay (Kapturowski et al. 2019: sequences of 80 rows, consecutive ones sharing 40):

- with L = `sequence_length`, o = `sequence_overlap` and stride s = L - o, a segment of n
  rows holds sequences starting at its rows 0, s, 2s, ...: k = 0 always (when n > 0), and
  k >= 1 while k*s + o < n, i.e. while sequence k still covers a row that sequence k - 1 did
  not. That is max(1, ceil((n - o) / s)) sequences for n > 0, and none for n = 0;
- a sequence's *valid* rows are min(L, n - k*s): the rest of it would run past its segment's
  end. Such a sequence is *padded*: it is still handed out by its start row, and the learner
  masks its rows after the segment's end (a segment's last row is always a `cut` row). So no
  segment is too short to keep, and no sequence's valid rows ever cross an episode's end.

Sampling is proportional prioritized replay over the sequences held, with the meaning of
`alpha`, `beta` (annealed to `beta_final` over `beta_anneal_iterations`) and `priority_eps`
of the prioritized transition buffer: P(i) = p_i^alpha / sum_j p_j^alpha, stratified draws
over the priority mass, importance weights (N P(i))^-beta / (N P_min)^-beta where N counts the
sequences held and P_min is the smallest non-zero probability. A new sequence gets the largest
priority seen so far. The learner sends one priority per sequence (R2D2 mixes eta x max +
(1 - eta) x mean |TD error| over its rows itself); priority_eps is added here. The priorities
kept are p (|TD| + eps), not p^alpha, so a snapshot does not depend on alpha; the cumulative
mass is recomputed (O(N), N in the thousands) on the first draw after anything changed.

Each sequence has a unique, ever-increasing id (contiguous per chunk, in insert order), and
the per-sequence arrays stay oldest first, so the ids held are ascending: a priority update
finds its sequence with one searchsorted, and an update for an evicted sequence is stale.

Counters and capacity are in transitions (rows), as in the episode buffer: `inserted_items`
and `evicted_items` count rows of chunks, `sampled_items` sequences x `sequence_length`
(what a rate limiter counts per sequence); whole chunks go, oldest first, once more than
`capacity` rows are held, and the newest chunk always stays, even alone over capacity.
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
from rlfleet.shared.replay.buffers.episode import _segments
from rlfleet.shared.replay.buffers.ring import _pack_ids, _unpack_ids

# Per sequence held, oldest chunk first, a chunk's sequences together in row order.
_SEQUENCE_FIELDS = {
    "seq_chunk": np.int32,         # ChunkTable index of its chunk
    "seq_start": np.int64,         # first row within the chunk
    "seq_valid": np.int64,         # rows inside its segment (<= sequence_length)
    "seq_uid": np.int64,           # item id (ascending along the array)
    "seq_priority": np.float64,    # p = |TD error| + priority_eps (or the max seen, if new)
    "seq_inserted_at": np.int64,   # train iteration at insert
    "seq_version": np.int64,       # policy version that produced it
    "seq_uses": np.int64,          # times sampled
}
# Per chunk held, oldest first.
_CHUNK_FIELDS = {
    "ch_index": np.int32,      # ChunkTable index
    "ch_length": np.int64,     # rows (what counts against capacity)
    "ch_sequences": np.int64,  # how many sequence entries above are its
}


def sequence_starts(length: int, sequence_length: int, overlap: int) -> np.ndarray:
    """Offsets within a segment of `length` rows of the sequences it holds (see the module
    docstring): 0, s, 2s, ... while each adds rows the one before did not cover."""
    if length <= 0:
        return np.zeros(0, dtype=np.int64)
    stride = sequence_length - overlap
    count = max(1, -(-(length - overlap) // stride))  # ceil((n - o) / s), at least 1
    return np.arange(count, dtype=np.int64) * stride


class SequenceBuffer(Buffer):
    """Prioritized over fixed-length, overlapping sequences inside one episode segment;
    sequences that would run past their segment's end are padded, never dropped."""

    kind = "sequence"
    # The columns of _SEQUENCE_FIELDS and _CHUNK_FIELDS, set and replaced whole by setattr.
    seq_chunk: np.ndarray
    seq_start: np.ndarray
    seq_valid: np.ndarray
    seq_uid: np.ndarray
    seq_priority: np.ndarray
    seq_inserted_at: np.ndarray
    seq_version: np.ndarray
    seq_uses: np.ndarray
    ch_index: np.ndarray
    ch_length: np.ndarray
    ch_sequences: np.ndarray

    def __init__(self, name: str, capacity: int, seed: int, sequence_length: int = 1,
                 sequence_overlap: int = 0, alpha: float = 0.6, beta: float = 0.4,
                 beta_final: float = 1.0, beta_anneal_iterations: int = 100_000,
                 priority_eps: float = 1e-6) -> None:
        super().__init__(name, capacity, seed)
        if sequence_length < 1:
            raise ValueError(f"buffers.{name}.sequence_length={sequence_length} must be at "
                             "least 1")
        if not 0 <= sequence_overlap < sequence_length:
            raise ValueError(f"buffers.{name}.sequence_overlap={sequence_overlap} must be at "
                             f"least 0 and less than sequence_length={sequence_length}")
        self.sequence_length = sequence_length
        self.sequence_overlap = sequence_overlap
        self.alpha, self.beta0, self.beta_final = alpha, beta, beta_final
        self.anneal = max(1, beta_anneal_iterations)
        self.eps = priority_eps
        self.table = ChunkTable()
        for key, dtype in {**_SEQUENCE_FIELDS, **_CHUNK_FIELDS}.items():
            setattr(self, key, np.zeros(0, dtype=dtype))
        self.size = 0      # rows of the chunks held
        self.next_uid = 0  # id of the next sequence inserted
        self.max_priority = 1.0
        self.train_iteration = 0  # of the last sample: where beta's annealing stands
        # (p^alpha, its cumulative sum, its smallest non-zero value) until something changes
        self._mass: tuple[np.ndarray, np.ndarray, float] | None = None

    def __len__(self) -> int:
        return self.size

    @property
    def num_sequences(self) -> int:
        return int(self.seq_uid.size)

    def chunk_ids(self) -> set[str]:
        return set(self.table.index)

    def chunk_occurrences(self) -> list[str]:
        return [c for c in self.table.ids if c is not None]

    def use_counts(self) -> np.ndarray:
        """Times each sequence held was sampled."""
        return self.seq_uses

    def beta(self, train_iteration: int) -> float:
        frac = min(1.0, max(0, train_iteration) / self.anneal)
        return self.beta0 + frac * (self.beta_final - self.beta0)

    def stats(self) -> dict[str, float]:
        out = super().stats()
        n = self.num_sequences
        out["sequences"] = float(n)
        out["padded_sequences"] = float((self.seq_valid < self.sequence_length).sum())
        out["valid_fraction"] = (float(self.seq_valid.mean()) / self.sequence_length
                                 if n else 0.0)
        out["chunks"] = float(self.ch_length.size)
        out["max_priority"] = float(self.max_priority)
        out["beta"] = float(self.beta(self.train_iteration))
        return out

    # -- inserting --------------------------------------------------------------------------

    def insert(self, chunks: list[ChunkInfo], train_iteration: int) -> list[str]:
        parsed = [(info, *_segments(info)) for info in chunks]  # all checked before any change
        L, o = self.sequence_length, self.sequence_overlap
        released: list[str] = []
        seen: set[str] = set()
        new_sequences: list[dict[str, np.ndarray]] = []
        new_chunks: list[tuple[int, int, int]] = []
        for info, seg_starts, seg_lengths in parsed:
            if info.chunk_id in self.table or info.chunk_id in seen:
                continue  # a retried report: already indexed (or already refused)
            seen.add(info.chunk_id)
            order = np.argsort(seg_starts, kind="stable")  # sequences in row order
            starts, valid = [], []
            for first, n in zip(seg_starts[order].tolist(), seg_lengths[order].tolist(),
                                strict=True):
                offsets = sequence_starts(n, L, o)
                starts.append(first + offsets)
                valid.append(np.minimum(L, n - offsets))
            count = sum(s.size for s in starts)
            if count == 0:  # no rows at all: nothing could ever be sampled from it
                self.monitor.dropped["empty"] += info.length
                self.release_reasons[info.chunk_id] = "dropped/empty"
                released.append(info.chunk_id)
                continue
            index = self.table.add(info.chunk_id, 1)
            new_sequences.append({
                "seq_chunk": np.full(count, index), "seq_start": np.concatenate(starts),
                "seq_valid": np.concatenate(valid),
                "seq_uid": self.next_uid + np.arange(count),
                "seq_priority": np.full(count, self.max_priority),
                "seq_inserted_at": np.full(count, train_iteration),
                "seq_version": np.full(count, info.policy_version),
                "seq_uses": np.zeros(count)})
            new_chunks.append((index, info.length, count))
            self.next_uid += count
            self.size += info.length
            self.monitor.inserted_items += info.length
            self.monitor.inserted_chunks += 1
        if new_chunks:
            for key, dtype in _SEQUENCE_FIELDS.items():
                parts = [getattr(self, key)] + [s[key] for s in new_sequences]
                setattr(self, key, np.concatenate(parts).astype(dtype, copy=False))
            for key, column in zip(_CHUNK_FIELDS, zip(*new_chunks, strict=True), strict=True):
                setattr(self, key, np.concatenate([getattr(self, key), column])
                        .astype(_CHUNK_FIELDS[key], copy=False))
            self._mass = None
            released += self._evict_overflow()
        self.monitor.released_chunks += len(released)
        return released

    def _evict_overflow(self) -> list[str]:
        """Drop the fewest oldest chunks that bring the rows held within capacity, never the
        newest chunk."""
        excess = self.size - self.capacity
        if excess <= 0 or self.ch_length.size < 2:
            return []
        cum = np.cumsum(self.ch_length[:-1])
        k = min(int(np.searchsorted(cum, excess)) + 1, cum.size)
        n_sequences = int(self.ch_sequences[:k].sum())
        rows = int(self.ch_length[:k].sum())
        released = self.table.names(self.ch_index[:k])  # oldest first
        self.table.release(self.ch_index[:k])  # one reference per chunk: all of them go
        for key in _SEQUENCE_FIELDS:
            setattr(self, key, getattr(self, key)[n_sequences:].copy())
        for key in _CHUNK_FIELDS:
            setattr(self, key, getattr(self, key)[k:].copy())
        self.size -= rows
        self.monitor.evicted_items += rows
        self._mass = None
        return released

    # -- sampling ---------------------------------------------------------------------------

    def _masses(self) -> tuple[np.ndarray, np.ndarray, float]:
        """(p^alpha per sequence, their cumulative sum, the smallest non-zero one)."""
        if self._mass is None:
            scaled = self.seq_priority ** self.alpha
            positive = scaled[scaled > 0]
            self._mass = (scaled, np.cumsum(scaled),
                          float(positive.min()) if positive.size else 0.0)
        return self._mass

    def sample(self, batch_size: int, num_batches: int, train_iteration: int,
               policy_version: int) -> SampleRefs:
        if batch_size < 1 or num_batches < 1:
            raise SampleError(f"batch_size={batch_size} and num_batches={num_batches} must "
                              "be at least 1")
        if self.num_sequences == 0:
            raise SampleError(f"buffer '{self.name}' is empty")
        scaled, mass, smallest = self._masses()
        total = float(mass[-1])
        if not total > 0:
            raise SampleError(f"buffer '{self.name}' has no sequence with positive priority")
        self.train_iteration = train_iteration
        n = batch_size * num_batches
        N = self.num_sequences
        # Stratified: one draw in each of n equal slices of the priority mass; side="right"
        # never lands on a sequence of priority zero (its slice of the mass is empty).
        draws = np.minimum((np.arange(n) + self.rng.random(n)) * (total / n),
                           np.nextafter(total, 0))
        seq = np.minimum(np.searchsorted(mass, draws, side="right"), N - 1)
        # The strata come out oldest first; shuffled, so that each batch of a multi-batch
        # request spans the whole buffer rather than one contiguous slice of it.
        seq = self.rng.permutation(seq)
        probs = scaled[seq] / total
        p_min = smallest / total
        beta = self.beta(train_iteration)
        weights = ((N * probs) ** (-beta) / (N * p_min) ** (-beta)).astype(np.float32)

        np.add.at(self.seq_uses, seq, self.seq_uses.dtype.type(1))  # numpy's fast path
        m = self.monitor
        m.sampled_items += n * self.sequence_length
        m.staleness_sum += float((train_iteration - self.seq_inserted_at[seq]).sum())
        m.staleness_count += n
        if policy_version >= 0:
            m.lag_sum += float((policy_version - self.seq_version[seq]).clip(min=0).sum())
            m.lag_count += n
        uniq, inverse = np.unique(self.seq_chunk[seq], return_inverse=True)
        shape = (num_batches, batch_size)
        return SampleRefs(
            chunk_ids=self.table.names(uniq), chunk_index=inverse.reshape(shape),
            rows=self.seq_start[seq].reshape(shape), item_ids=self.seq_uid[seq].reshape(shape),
            weights=weights.reshape(shape), sequence_length=self.sequence_length)

    # -- priorities -------------------------------------------------------------------------

    def update_priorities(self, item_ids: np.ndarray, priorities: np.ndarray) -> int:
        """One priority per sequence (|TD error| as the learner mixes it); updates naming
        sequences no longer held are stale: counted and ignored. Within one update a
        repeated id takes its last priority."""
        item_ids = np.asarray(item_ids, dtype=np.int64).reshape(-1)
        priorities = np.asarray(priorities, dtype=np.float64).reshape(-1)
        if item_ids.shape != priorities.shape:
            raise ValueError(f"{item_ids.size} item ids but {priorities.size} priorities")
        if not np.isfinite(priorities).all() or (priorities < 0).any():
            raise ValueError("priorities must be finite and non-negative")
        pos = np.searchsorted(self.seq_uid, item_ids)
        inside = pos < self.num_sequences
        live = np.zeros(item_ids.shape, dtype=bool)
        live[inside] = self.seq_uid[pos[inside]] == item_ids[inside]
        applied = int(live.sum())
        self.monitor.priority_updates += applied
        self.monitor.stale_priority_updates += int(item_ids.size - applied)
        if applied:
            p = priorities[live] + self.eps
            self.max_priority = max(self.max_priority, float(p.max()))
            self.seq_priority[pos[live]] = p
            self._mass = None
        return applied

    # -- snapshots --------------------------------------------------------------------------

    def _shape(self) -> dict[str, str]:
        return {"sequence_length": str(self.sequence_length),
                "sequence_overlap": str(self.sequence_overlap)}

    def snapshot(self) -> tuple[dict[str, np.ndarray], dict[str, str]]:
        ids, index = self.table.snapshot()
        arrays = {key: getattr(self, key).copy()
                  for key in {**_SEQUENCE_FIELDS, **_CHUNK_FIELDS}}
        arrays.update(table_ids=_pack_ids(ids), table_index=index,
                      table_free=np.array(self.table._free, dtype=np.int64))
        return arrays, self.snapshot_meta(**self._shape(), next_uid=str(self.next_uid),
                                          max_priority=repr(self.max_priority),
                                          train_iteration=str(self.train_iteration))

    def restore(self, arrays: dict[str, np.ndarray], meta: dict[str, str]) -> None:
        self.check_snapshot(meta, **self._shape())
        values = {key: np.asarray(arrays[key]).astype(dtype)
                  for key, dtype in {**_SEQUENCE_FIELDS, **_CHUNK_FIELDS}.items()}
        if int(values["ch_sequences"].sum()) != values["seq_uid"].size:
            raise ValueError(f"buffers.{self.name}: snapshot's chunk and sequence arrays "
                             "disagree")
        # The table comes back with the same indices and free list, so that sampling after
        # a restore names chunks in the same order as the buffer that was saved.
        table = ChunkTable()
        index, free = arrays["table_index"].tolist(), arrays["table_free"].tolist()
        size = len(index) + len(free)  # every table entry is live or free
        table.ids, table.refs = [None] * size, [0] * size
        for chunk_id, i in zip(_unpack_ids(arrays["table_ids"]), index, strict=True):
            table.ids[i], table.refs[i] = chunk_id, 1
            table.index[chunk_id] = i
        table._free = free
        for key, value in values.items():
            setattr(self, key, value)
        self.table = table
        self.size = int(self.ch_length.sum())
        self.next_uid = int(meta["next_uid"])
        self.max_priority = float(meta["max_priority"])
        self.train_iteration = int(meta["train_iteration"])
        self._mass = None
        self.monitor_restore(meta)
