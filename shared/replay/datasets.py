"""Dataset buffers: a Minari dataset (ours from `rlfleet export`, or anyone's) turned into
stored chunks and a read-only buffer, once, when the coordinator starts.

Chunks are named `dataset-<buffer>-<n>` and written again at every start: the same dataset
gives the same bytes, so a restart overwrites them with themselves, and a changed dataset
file is what the run learns from after a restart. Stacked image frames are stored once and
compressed like a collector's chunks (`rlfleet.shared.contract.frames`), so the learner
reads both alike.
"""

from __future__ import annotations

import logging

from rlfleet.shared.contract.codec import encode_arrays
from rlfleet.shared.contract.config import BufferConfig
from rlfleet.shared.contract.frames import chunk_compression, pack, packable
from rlfleet.shared.data.datasets import episodes, open_dataset, transitions
from rlfleet.shared.envs.make import run_spec
from rlfleet.shared.infra.storage import Storage
from rlfleet.shared.replay.buffers.base import ChunkInfo
from rlfleet.shared.replay.buffers.dataset import DatasetBuffer
from rlfleet.shared.run.config import RunConfig

log = logging.getLogger("rlfleet.coordinator")

ROWS_PER_CHUNK = 4096


def load_dataset_buffer(name: str, bcfg: BufferConfig, cfg: RunConfig, storage: Storage,
                        seed: int) -> DatasetBuffer:
    field = f"buffers.{name}"
    ds = open_dataset(bcfg.path, bcfg.minari_id, field)
    columns = transitions(episodes(ds, run_spec(cfg), field), field)
    n = len(columns["reward"])
    infos: list[ChunkInfo] = []
    for k, start in enumerate(range(0, n, ROWS_PER_CHUNK)):
        part = {key: col[start:start + ROWS_PER_CHUNK] for key, col in columns.items()}
        part["cut"] = part["cut"].copy()
        part["cut"][-1] = True  # a run ends with its chunk
        if packable(part):
            part = pack(part)
        chunk_id = f"dataset-{name}-{k:06d}"
        storage.put_chunk(chunk_id, encode_arrays(
            part, {"policy_version": "0", "dataset": name},
            compression=chunk_compression("auto", part)))
        infos.append(ChunkInfo(chunk_id, len(part["reward"]), 0))
    log.info("buffers.%s: %d transitions of %s in %d chunks", name, n,
             bcfg.path or bcfg.minari_id, len(infos))
    return DatasetBuffer(name, infos, seed)
