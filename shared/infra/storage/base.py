"""The storage interface every backend implements.

Chunks are immutable once written: a chunk id names the same bytes forever, which is what lets
learners cache them. Weights are versioned; `latest_version` is the cheap call collectors poll.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping, Sequence

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


class StorageError(RuntimeError):
    """The backend failed (unreachable, full, refused)."""


class VersionConflict(RuntimeError):
    """A policy version at or below the newest one already published, with other bytes: some
    other learner publishes (a rank that hung and woke up outside its group). Versions are
    never published twice; the caller is not the publisher any more."""


class ChunkNotFound(KeyError):
    """A chunk id that storage does not hold (never written, or evicted and deleted)."""

    def __init__(self, chunk_id: str) -> None:
        super().__init__(chunk_id)
        self.chunk_id = chunk_id

    def __str__(self) -> str:
        return f"chunk '{self.chunk_id}' is not in storage"


def validate_id(chunk_id: str) -> str:
    """Ids become file names and Redis keys, so they are kept to a safe alphabet."""
    if not isinstance(chunk_id, str) or not _ID.match(chunk_id):
        raise ValueError(f"chunk id {chunk_id!r} must match {_ID.pattern}")
    return chunk_id


class Storage(ABC):
    """Experience chunks plus versioned policy weights."""

    keep_weight_versions: int = 4

    @abstractmethod
    def put_chunks(self, chunks: Mapping[str, bytes]) -> None:
        """Write chunks; when this returns they are durable enough to announce."""

    def put_chunk(self, chunk_id: str, data: bytes) -> None:
        self.put_chunks({chunk_id: data})

    @abstractmethod
    def get_chunks(self, chunk_ids: Sequence[str]) -> list[bytes]:
        """The chunks' bytes, in order; raises `ChunkNotFound` naming the first missing id."""

    def get_chunk(self, chunk_id: str) -> bytes:
        return self.get_chunks([chunk_id])[0]

    @abstractmethod
    def delete_chunks(self, chunk_ids: Iterable[str]) -> int:
        """Delete chunks (missing ones are ignored); returns how many were deleted."""

    @abstractmethod
    def list_chunks(self) -> list[str]:
        """Every chunk id held, for garbage collection and tests."""

    @abstractmethod
    def put_weights(self, version: int, data: bytes) -> None:
        """Store a policy version, then announce it as the latest (in that order), and drop
        versions older than the newest `keep_weight_versions`. Raises `VersionConflict` if
        `version` is not newer than the latest (unless it is this very blob, written by a
        retried call)."""

    @abstractmethod
    def latest_version(self) -> int | None:
        """The newest announced policy version, or None before the first publish."""

    @abstractmethod
    def get_weights(self, version: int | None = None) -> tuple[int, bytes] | None:
        """(version, bytes) of the given or latest version; None if there is none."""

    @abstractmethod
    def put_blob(self, name: str, data: bytes) -> None:
        """Write a named blob (snapshots, run state): replaced atomically as a whole."""

    @abstractmethod
    def get_blob(self, name: str) -> bytes | None:
        """A named blob, or None."""

    @abstractmethod
    def delete_blob(self, name: str) -> None:
        """Delete a named blob (a missing one is fine)."""

    # -- the coordinator's write-ahead journal -----------------------------------------------
    # Chunk metadata is appended here before the coordinator acknowledges a report, so a
    # coordinator that dies between acknowledging and its next snapshot loses nothing: a
    # restart loads the snapshot of generation G and replays journals G, G+1, ... in order.

    @abstractmethod
    def append_journal(self, generation: int, records: Sequence[bytes]) -> None:
        """Append records to the journal of `generation`, all or none; when this returns
        they are as durable as a chunk write. Raises `StorageError` when it cannot."""

    @abstractmethod
    def read_journal(self, generation: int) -> list[bytes]:
        """The records of one generation's journal in append order ([] if none). A record
        torn by a crash mid-append is not returned, nor anything after it."""

    @abstractmethod
    def journal_generations(self) -> list[int]:
        """Generations that have a journal, ascending."""

    @abstractmethod
    def delete_journals(self, before: int) -> None:
        """Delete the journals of every generation lower than `before`."""

    def close(self) -> None:  # noqa: B027 - optional for backends without connections
        """Release connections."""
