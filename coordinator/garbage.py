"""Chunks in storage that nobody announced: found, given a grace, deleted, and refused if
their report turns up after all.

A collector that dies between writing a chunk and reporting it leaves the chunk in storage
with no buffer holding it, and so does a coordinator that dies between releasing chunks and
deleting them. The janitor (`Durability`) lists storage now and then and hands what no
buffer holds and nothing waits to delete to `OrphanCollector.collect`; a chunk unheld for
`coordinator.orphan_grace_s` is deleted. Its bytes are gone, so a late report of it must not
be acknowledged: `refuse_deleted` filters it out of every report.
"""

from __future__ import annotations

import logging
from collections import OrderedDict

from rlfleet.coordinator.state import CoordinatorState
from rlfleet.shared.contract.wire.experience import ChunkMeta
from rlfleet.shared.infra.storage import Storage
from rlfleet.shared.replay.replay import Replay

log = logging.getLogger("rlfleet.coordinator")

MAX_REMEMBERED = 100_000  # ids deleted as orphans remembered, to refuse late reports


class OrphanCollector:
    def __init__(self, grace_s: float, storage: Storage, state: CoordinatorState,
                 replay: Replay) -> None:
        self.grace_s = grace_s
        self._storage = storage
        self._state = state
        self._replay = replay
        self._unannounced: dict[str, float] = {}  # chunk id -> when GC first saw it orphaned
        self._deleted: OrderedDict[str, None] = OrderedDict()  # refused if reported late
        self.orphans_deleted = 0

    @property
    def unannounced(self) -> int:
        """Chunks in storage that GC saw no buffer hold, still within their grace."""
        return len(self._unannounced)

    def refuse_deleted(self, fresh: list[ChunkMeta]) -> list[ChunkMeta]:
        """A report's new chunks less those deleted as never announced (under the state's
        lock): their bytes are gone, never acknowledge them."""
        late = [m.chunk_id for m in fresh if m.chunk_id in self._deleted]
        if not late:
            return fresh
        log.warning("refusing %d chunks reported after they were deleted as never "
                    "announced: %s", len(late), late[:3])
        return [m for m in fresh if m.chunk_id not in self._deleted]

    def orphans(self, stored: list[str], pending: set[str]) -> set[str]:
        """Of the chunks in storage, those no buffer holds and nothing waits to delete
        (under the state's lock, with `pending` copied under the same hold)."""
        return {c for c in stored if c not in self._replay.registry and c not in pending}

    def collect(self, orphans: set[str]) -> list[str]:
        """Delete the orphans unannounced for the grace; returns the ids deleted."""
        now = self._state.clock()
        for chunk_id in [c for c in self._unannounced if c not in orphans]:
            del self._unannounced[chunk_id]
        for chunk_id in orphans:
            self._unannounced.setdefault(chunk_id, now)
        expired = [c for c, seen in self._unannounced.items() if now - seen >= self.grace_s]
        if not expired:
            return []
        with self._state.cond:  # reported since the listing? then it is not an orphan
            expired = [c for c in expired if c not in self._replay.registry]
            for chunk_id in expired:  # a report arriving after this is refused
                self._deleted[chunk_id] = None
            while len(self._deleted) > MAX_REMEMBERED:
                self._deleted.popitem(last=False)
        self._storage.delete_chunks(expired)
        for chunk_id in expired:
            self._unannounced.pop(chunk_id, None)
        self.orphans_deleted += len(expired)
        log.warning("deleted %d chunks nobody announced within %.0fs", len(expired),
                    self.grace_s)
        return expired


__all__ = ["OrphanCollector"]
