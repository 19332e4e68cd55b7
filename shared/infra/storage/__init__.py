"""Data-plane storage: experience chunks and versioned policy weights.

Two backends behind one interface: a directory (the embedded default, also a shared
filesystem) and Redis. `open_storage` picks one from a URL-ish string.
"""

import os

from rlfleet.shared.contract.config import ConfigError
from rlfleet.shared.infra.storage.base import (
    ChunkNotFound,
    Storage,
    StorageError,
    VersionConflict,
    validate_id,
)
from rlfleet.shared.infra.storage.directory import DirectoryStorage

RETRY_ENV = "RLFLEET_STORAGE_RETRY_S"


def evaluated_blob(task_id: str) -> str:
    """Blob name of the weights an evaluation task ran with (written by the collector,
    kept or deleted by the coordinator)."""
    return f"evaluated-{task_id}"


def video_blob(task_id: str) -> str:
    """Blob name of an evaluation's video (MP4), written by the collector and moved to the
    run dir by the coordinator."""
    return f"video-{task_id}"


def video_gif_blob(task_id: str) -> str:
    """Blob name of the small GIF of an evaluation's video, for TensorBoard."""
    return f"video-gif-{task_id}"


def snapshot_blob(version: int) -> str:
    """Blob name of a league snapshot's weights: a policy version kept for as long as the
    league holds it (published versions are pruned within seconds)."""
    return f"league-snapshot-{int(version)}"


def open_storage(url: str, namespace: str = "run", max_retry_s: float | None = None
                 ) -> Storage:
    """`redis://host:port/db` gives Redis (keys under `rlfleet:<namespace>:`); anything else
    (a path, or `file:///path`) gives a directory.

    `RLFLEET_STORAGE_RETRY_S` sets how long Redis calls ride out an outage before failing
    (default 15 s): an operator tunes it per deployment without touching the run's config.
    `max_retry_s` caps it for a caller with a better plan than waiting (a collector holds
    its chunks and goes on collecting)."""
    if url.startswith(("redis://", "rediss://", "unix://")):
        from rlfleet.shared.infra.storage.redis_store import RedisStorage

        retry_s = storage_retry_s()
        retry_s = retry_s if max_retry_s is None else min(retry_s, max_retry_s)
        return RedisStorage(url, namespace, retry_s=retry_s)
    if url.startswith("file://"):
        url = url[len("file://"):]
    return DirectoryStorage(url)


def __getattr__(name: str):
    """`RedisStorage` on first use: importing redis takes time that a run on a directory
    (the local default) need not spend while it starts."""
    if name == "RedisStorage":
        from rlfleet.shared.infra.storage.redis_store import RedisStorage

        return RedisStorage
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def storage_retry_s() -> float:
    """`RLFLEET_STORAGE_RETRY_S`, or Redis's default. Raises `ConfigError` naming the
    variable (the CLI checks it before a command that opens storage starts)."""
    raw = os.environ.get(RETRY_ENV, "").strip()
    if not raw:
        from rlfleet.shared.infra.storage.redis_store import DEFAULT_RETRY_S

        return DEFAULT_RETRY_S
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{RETRY_ENV}={raw!r} must be a number of seconds") from None
    if not value >= 0:  # also rejects nan
        raise ConfigError(f"{RETRY_ENV}={raw!r} must be >= 0")
    return value


__all__ = ["ChunkNotFound", "DirectoryStorage", "RedisStorage", "Storage", "StorageError",
           "VersionConflict", "evaluated_blob", "open_storage", "snapshot_blob",
           "storage_retry_s", "validate_id"]
