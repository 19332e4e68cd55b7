"""Episode buffer: sequences of consecutive rows that never leave one episode.

A chunk's rows are grouped per env trajectory, and `ChunkInfo.segments` names its runs of rows
from one episode (one per whole episode, or one per env fragment between episode ends; none
means the whole chunk is one run). The buffer keeps those segments, whole chunks at a time,
and samples sequences of `sequence_length` rows that stay inside one segment, so a recurrent
or n-step learner never reads two episodes glued together.

Items are the valid sequence starts: a segment of n rows holds max(0, n - L + 1) of them.
Each start gets a unique, ever-increasing id when its chunk is inserted: `seg_uid[s]` is the
id of segment s's first start and the rest follow row by row, so an item id names
(segment, offset) without any stride limit on segment length. Sampling is uniform over every
start held: one integer draw per sequence, mapped to its segment by a searchsorted over the
cumulative start counts.

Counters are in transitions (rows), like the transition buffers, so that a samples-per-insert
ratio keeps its meaning: `inserted_items` and `evicted_items` count the rows of chunks,
`sampled_items` counts sequences x `sequence_length` (a rate limiter asking for batches must
count `batch_size * sequence_length` items per batch). Capacity is in transitions too: whole
chunks go, oldest first, once more than `capacity` rows are held; the newest chunk always
stays, even alone over capacity. A chunk with no segment of at least `sequence_length` rows
could never be sampled: it is not indexed, is released at once and its rows are counted in
`dropped["too_short"]`.
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
from rlfleet.shared.replay.buffers.ring import _pack_ids, _unpack_ids

# Per segment that holds at least one start, oldest chunk first, a chunk's segments together.
_SEGMENT_FIELDS = {
    "seg_chunk": np.int32,        # ChunkTable index of its chunk
    "seg_start": np.int64,        # first row within the chunk
    "seg_length": np.int64,       # rows
    "seg_uid": np.int64,          # item id of its first sequence start
    "seg_inserted_at": np.int64,  # train iteration at insert
    "seg_version": np.int64,      # policy version that produced it
    "seg_uses": np.int64,         # sequences sampled from it
}
# Per chunk held, oldest first.
_CHUNK_FIELDS = {
    "ch_index": np.int32,     # ChunkTable index
    "ch_length": np.int64,    # rows (what counts against capacity)
    "ch_segments": np.int64,  # how many segment entries above are its
}

def _segments(info: ChunkInfo) -> tuple[np.ndarray, np.ndarray]:
    """(start rows, lengths) of a chunk's episode runs, checked to fit without overlap."""
    if info.length < 0:
        raise ValueError(f"chunk {info.chunk_id}: length={info.length} is negative")
    runs = info.segments or ((0, info.length),)
    arr = np.asarray(runs, dtype=np.int64).reshape(-1, 2)
    starts, lengths = arr[:, 0], arr[:, 1]
    ends = starts + lengths
    if (starts < 0).any() or (lengths < 0).any() or (ends > info.length).any():
        raise ValueError(f"chunk {info.chunk_id}: segments {list(runs)} do not fit in its "
                         f"{info.length} rows")
    order = np.argsort(starts, kind="stable")
    if (starts[order][1:] < ends[order][:-1]).any():
        raise ValueError(f"chunk {info.chunk_id}: segments {list(runs)} overlap")
    return starts, lengths


class EpisodeBuffer(Buffer):
    """Uniform over sequences of `sequence_length` rows inside one episode segment."""

    kind = "episode"
    # The columns of _SEGMENT_FIELDS and _CHUNK_FIELDS, set and replaced whole by setattr.
    seg_chunk: np.ndarray
    seg_start: np.ndarray
    seg_length: np.ndarray
    seg_uid: np.ndarray
    seg_inserted_at: np.ndarray
    seg_version: np.ndarray
    seg_uses: np.ndarray
    ch_index: np.ndarray
    ch_length: np.ndarray
    ch_segments: np.ndarray

    def __init__(self, name: str, capacity: int, seed: int, sequence_length: int = 1) -> None:
        super().__init__(name, capacity, seed)
        if sequence_length < 1:
            raise ValueError(f"buffers.{name}.sequence_length={sequence_length} must be at "
                             "least 1")
        self.sequence_length = sequence_length
        self.table = ChunkTable()
        for key, dtype in {**_SEGMENT_FIELDS, **_CHUNK_FIELDS}.items():
            setattr(self, key, np.zeros(0, dtype=dtype))
        self.size = 0      # rows of the chunks held
        self.next_uid = 0  # id of the next sequence start inserted
        self._cum: np.ndarray | None = None  # cumulative starts per segment, until changed

    def __len__(self) -> int:
        return self.size

    def chunk_ids(self) -> set[str]:
        return set(self.table.index)

    def chunk_occurrences(self) -> list[str]:
        return [c for c in self.table.ids if c is not None]

    def use_counts(self) -> np.ndarray:
        """Sequences sampled from each segment held."""
        return self.seg_uses

    def _cumulative_starts(self) -> np.ndarray:
        if self._cum is None:
            self._cum = np.cumsum(self.seg_length - (self.sequence_length - 1))
        return self._cum

    @property
    def num_sequences(self) -> int:
        """Valid sequence starts held: what one uniform draw chooses among."""
        cum = self._cumulative_starts()
        return int(cum[-1]) if cum.size else 0

    def stats(self) -> dict[str, float]:
        out = super().stats()
        out["sequences"] = float(self.num_sequences)
        out["segments"] = float(self.seg_length.size)
        out["chunks"] = float(self.ch_length.size)
        return out

    # -- inserting --------------------------------------------------------------------------

    def insert(self, chunks: list[ChunkInfo], train_iteration: int) -> list[str]:
        parsed = [(info, *_segments(info)) for info in chunks]  # all checked before any change
        L = self.sequence_length
        released: list[str] = []
        seen: set[str] = set()
        new_segments: list[dict[str, np.ndarray]] = []
        new_chunks: list[tuple[int, int, int]] = []
        for info, starts, lengths in parsed:
            if info.chunk_id in self.table or info.chunk_id in seen:
                continue  # a retried report: already indexed (or already refused)
            seen.add(info.chunk_id)
            keep = lengths >= L
            if not keep.any():
                self.monitor.dropped["too_short"] += info.length
                self.release_reasons[info.chunk_id] = "dropped/too_short"
                released.append(info.chunk_id)
                continue
            starts, lengths = starts[keep], lengths[keep]
            n_starts = lengths - (L - 1)
            index = self.table.add(info.chunk_id, 1)
            new_segments.append({
                "seg_chunk": np.full(starts.size, index), "seg_start": starts,
                "seg_length": lengths, "seg_uid": self.next_uid + np.cumsum(n_starts) - n_starts,
                "seg_inserted_at": np.full(starts.size, train_iteration),
                "seg_version": np.full(starts.size, info.policy_version),
                "seg_uses": np.zeros(starts.size)})
            new_chunks.append((index, info.length, starts.size))
            self.next_uid += int(n_starts.sum())
            self.size += info.length
            self.monitor.inserted_items += info.length
            self.monitor.inserted_chunks += 1
        if new_chunks:
            for key, dtype in _SEGMENT_FIELDS.items():
                parts = [getattr(self, key)] + [s[key] for s in new_segments]
                setattr(self, key, np.concatenate(parts).astype(dtype, copy=False))
            for key, column in zip(_CHUNK_FIELDS, zip(*new_chunks, strict=True), strict=True):
                setattr(self, key, np.concatenate([getattr(self, key), column])
                        .astype(_CHUNK_FIELDS[key], copy=False))
            self._cum = None
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
        n_segments = int(self.ch_segments[:k].sum())
        rows = int(self.ch_length[:k].sum())
        released = self.table.names(self.ch_index[:k])  # oldest first
        self.table.release(self.ch_index[:k])  # one reference per chunk: all of them go
        for key in _SEGMENT_FIELDS:
            setattr(self, key, getattr(self, key)[n_segments:].copy())
        for key in _CHUNK_FIELDS:
            setattr(self, key, getattr(self, key)[k:].copy())
        self.size -= rows
        self.monitor.evicted_items += rows
        self._cum = None
        return released

    # -- sampling ---------------------------------------------------------------------------

    def sample(self, batch_size: int, num_batches: int, train_iteration: int,
               policy_version: int) -> SampleRefs:
        if batch_size < 1 or num_batches < 1:
            raise SampleError(f"batch_size={batch_size} and num_batches={num_batches} must "
                              "be at least 1")
        total = self.num_sequences
        if total == 0:
            raise SampleError(f"buffer '{self.name}' holds no segment of at least "
                              f"sequence_length={self.sequence_length} rows")
        n = batch_size * num_batches
        cum = self._cumulative_starts()
        draws = self.rng.integers(total, size=n)
        seg = np.searchsorted(cum, draws, side="right")
        offset = draws - (cum[seg] - (self.seg_length[seg] - (self.sequence_length - 1)))
        np.add.at(self.seg_uses, seg, 1)
        m = self.monitor
        m.sampled_items += n * self.sequence_length
        m.staleness_sum += float((train_iteration - self.seg_inserted_at[seg]).sum())
        m.staleness_count += n
        if policy_version >= 0:
            m.lag_sum += float((policy_version - self.seg_version[seg]).clip(min=0).sum())
            m.lag_count += n
        uniq, inverse = np.unique(self.seg_chunk[seg], return_inverse=True)
        shape = (num_batches, batch_size)
        return SampleRefs(
            chunk_ids=self.table.names(uniq), chunk_index=inverse.reshape(shape),
            rows=(self.seg_start[seg] + offset).reshape(shape),
            item_ids=(self.seg_uid[seg] + offset).reshape(shape),
            sequence_length=self.sequence_length)

    # -- snapshots --------------------------------------------------------------------------

    def snapshot(self) -> tuple[dict[str, np.ndarray], dict[str, str]]:
        ids, index = self.table.snapshot()
        arrays = {key: getattr(self, key).copy() for key in {**_SEGMENT_FIELDS, **_CHUNK_FIELDS}}
        arrays.update(table_ids=_pack_ids(ids), table_index=index,
                      table_free=np.array(self.table._free, dtype=np.int64))
        return arrays, self.snapshot_meta(sequence_length=str(self.sequence_length),
                                          next_uid=str(self.next_uid))

    def restore(self, arrays: dict[str, np.ndarray], meta: dict[str, str]) -> None:
        self.check_snapshot(meta, sequence_length=str(self.sequence_length))
        values = {key: np.asarray(arrays[key]).astype(dtype)
                  for key, dtype in {**_SEGMENT_FIELDS, **_CHUNK_FIELDS}.items()}
        if int(values["ch_segments"].sum()) != values["seg_length"].size:
            raise ValueError(f"buffers.{self.name}: snapshot's chunk and segment arrays "
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
        self._cum = None
        self.monitor_restore(meta)
