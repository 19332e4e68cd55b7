"""A read-only buffer over a dataset: uniform sampling of transitions nobody inserts.

The coordinator loads the dataset once at start (`rlfleet.shared.replay.datasets`), stores it as
chunks and indexes every transition here. Its chunks are outside the chunk registry and the
ledger (no collector acknowledged them and nothing may evict them), and its snapshot carries
only counters: a restarted coordinator reloads the dataset, which is the index's source.
"""

from __future__ import annotations

import numpy as np

from rlfleet.shared.replay.buffers.base import ChunkInfo
from rlfleet.shared.replay.buffers.ring import UniformBuffer


class DatasetBuffer(UniformBuffer):
    kind = "dataset"

    def __init__(self, name: str, chunks: list[ChunkInfo], seed: int) -> None:
        super().__init__(name, max(1, sum(c.length for c in chunks)), seed, replacement=True)
        super().insert(chunks, 0)

    def insert(self, chunks: list[ChunkInfo], train_iteration: int) -> list[str]:
        raise ValueError(f"buffers.{self.name} is a read-only dataset buffer")

    def snapshot(self) -> tuple[dict[str, np.ndarray], dict[str, str]]:
        return {"counters": np.zeros(1, dtype=np.int64)}, self.snapshot_meta()

    def restore(self, arrays: dict[str, np.ndarray], meta: dict[str, str]) -> None:
        inserted = self.monitor.inserted_items, self.monitor.inserted_chunks
        self.monitor_restore(meta)  # sampling counters and the generator go on
        self.monitor.inserted_items, self.monitor.inserted_chunks = inserted
