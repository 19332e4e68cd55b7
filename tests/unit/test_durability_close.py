"""Closing the coordinator deletes what its last snapshots freed, even deletions the janitor
never got to: a periodic snapshot written as the close began queues its deletions behind the
janitor's stop, and they must not wait for a later GC (`orphan_grace_s`) to go."""

from __future__ import annotations

from pathlib import Path

from rlfleet.coordinator.app import create_app
from rlfleet.shared.run.config import parse_config

from .helpers import make_config


def test_deletions_queued_behind_the_janitors_stop_happen_at_close(tmp_path: Path) -> None:
    app = create_app(parse_config(make_config()), str(tmp_path / "storage"), tmp_path / "run",
                     start=False)
    service = app.extensions["rlfleet"]
    durability, storage = service.durability, service.storage
    freed = [f"{i:032x}" for i in range(3)]
    for chunk_id in freed:
        storage.put_chunk(chunk_id, b"freed by a snapshot")
    durability.start()
    # The janitor takes its stop, then the snapshot it was writing queues its deletions.
    durability._delete_q.put(None)
    durability._janitor.join(timeout=5)
    durability._delete_q.put(list(freed))
    service.close()
    assert not set(freed) & set(storage.list_chunks())
