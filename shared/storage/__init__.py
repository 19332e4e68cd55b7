"""Data-plane storage: experience chunks and versioned policy weights.

Two backends behind one interface: a directory (the embedded default, also a shared
filesystem) and Redis. `open_storage` picks one from a URL-ish string.
"""

from shared.storage.base import ChunkNotFound, Storage, StorageError, validate_id
from shared.storage.directory import DirectoryStorage
from shared.storage.redis_store import RedisStorage


def evaluated_blob(task_id: str) -> str:
    """Blob name of the weights an evaluation task ran with (written by the collector,
    kept or deleted by the coordinator)."""
    return f"evaluated-{task_id}"


def open_storage(url: str, namespace: str = "run") -> Storage:
    """`redis://host:port/db` gives Redis (keys under `rlfleet:<namespace>:`); anything else
    (a path, or `file:///path`) gives a directory."""
    if url.startswith(("redis://", "rediss://", "unix://")):
        return RedisStorage(url, namespace)
    if url.startswith("file://"):
        url = url[len("file://"):]
    return DirectoryStorage(url)


__all__ = ["ChunkNotFound", "DirectoryStorage", "RedisStorage", "Storage", "StorageError",
           "evaluated_blob", "open_storage", "validate_id"]
