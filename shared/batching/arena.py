"""Decoded chunks kept in one preallocated array per field, in equal slots.

A learner request names hundreds of chunks. Concatenating their columns for every request
would copy the whole sampled working set each time, time taken from the updates it feeds.
In the arena each chunk is written once, when first seen, into a slot; a batch is then one
fancy index per field over the arena, whatever the number of chunks it touches. Chunks never
change, so a slot needs no invalidation, only LRU reuse.

Chunks of stacked image observations hold each frame once (`shared/contract/frames.py`): a
slot then has room for `slot_frames` frames beside its rows, and a row's frame indices are
stored rebased to the arena, so a batch's stacks are one more gather
(`rlfleet.shared.contract.frames.take`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from rlfleet.shared.contract.frames import FRAMES, INDEX

Fetch = Callable[[list[str]], Sequence[Mapping[str, np.ndarray]]]


class ChunkArena:
    def __init__(self, fetch: Fetch, capacity: int) -> None:
        """`fetch(ids)` returns the decoded chunks (dicts of arrays) for ids not held yet."""
        self.fetch = fetch
        self.capacity = max(1, capacity)
        self.slot_rows = 0
        self.slot_frames = 0
        self.columns: dict[str, np.ndarray] = {}
        self.slots: OrderedDict[str, int] = OrderedDict()  # chunk id -> slot, oldest use first
        self._free: list[int] = []
        self.hits = 0
        self.misses = 0

    def __contains__(self, chunk_id: str) -> bool:
        return chunk_id in self.slots

    def _allocate(self, template: Mapping[str, np.ndarray], rows: int, frames: int,
                  capacity: int) -> None:
        """(Re)build the arena with `capacity` slots of `rows` rows (and `frames` frames),
        keeping held chunks."""
        old_columns, old_rows, old_frames = self.columns, self.slot_rows, self.slot_frames
        self.columns = {f: np.empty((capacity * (frames if f == FRAMES else rows),
                                     *a.shape[1:]), dtype=a.dtype)
                        for f, a in template.items()}
        for slot in self.slots.values():
            for f, col in old_columns.items():
                new, old = (frames, old_frames) if f == FRAMES else (rows, old_rows)
                dest = self.columns[f][slot * new: slot * new + old]
                dest[:] = col[slot * old: (slot + 1) * old]
                if f in INDEX.values():  # frame indices follow their frames
                    dest += slot * (frames - old_frames)
        used = set(self.slots.values())
        self._free = [s for s in range(capacity - 1, -1, -1) if s not in used]
        self.slot_rows, self.slot_frames, self.capacity = rows, frames, capacity

    def offsets(self, chunk_ids: Sequence[str]) -> np.ndarray:
        """The first arena row of each chunk, reading the ones not held yet."""
        for c in chunk_ids:
            if c in self.slots:
                self.slots.move_to_end(c)
        missing = list(dict.fromkeys(c for c in chunk_ids if c not in self.slots))
        self.misses += len(missing)
        self.hits += len(chunk_ids) - len(missing)
        if missing:
            self._store(missing, self.fetch(missing), len(set(chunk_ids)))
        return np.fromiter((self.slots[c] * self.slot_rows for c in chunk_ids), dtype=np.int64,
                           count=len(chunk_ids))

    def _store(self, ids: list[str], chunks: Sequence[Mapping[str, np.ndarray]],
               needed: int) -> None:
        longest = max(len(c["reward"]) for c in chunks)
        most_frames = max(len(c[FRAMES]) if FRAMES in c else 0 for c in chunks)
        if (not self.columns or longest > self.slot_rows or most_frames > self.slot_frames
                or needed > self.capacity):
            self._allocate(chunks[0], max(longest, self.slot_rows),
                           max(most_frames, self.slot_frames), max(self.capacity, needed))
        for chunk_id, chunk in zip(ids, chunks, strict=True):
            if self._free:
                slot = self._free.pop()
            else:  # reuse the least recently used slot (never one this request needs:
                _, slot = self.slots.popitem(last=False)  # those were just moved to the end)
            start, n = slot * self.slot_rows, len(chunk["reward"])
            first_frame = slot * self.slot_frames
            for f, col in self.columns.items():
                if f == FRAMES:
                    col[first_frame:first_frame + len(chunk[f])] = chunk[f]
                elif f in INDEX.values():
                    np.add(chunk[f], first_frame, out=col[start:start + n])
                else:
                    col[start:start + n] = chunk[f]
            self.slots[chunk_id] = slot
