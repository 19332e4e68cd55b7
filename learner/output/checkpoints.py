"""The learner's checkpoints: everything needed to continue training, kept in run storage.

A checkpoint is one safetensors blob (`<prefix>-<train iteration>`) holding the policy's
`state_dict()` (networks, optimizer state, counters as tensors) with string metadata
(counters, time, the configured extra metadata). An index blob (`<prefix>-index`, JSON)
lists them oldest first and names the best one; it is written after the checkpoint itself,
so a crash between the two leaves the previous index, which names only whole checkpoints.
Storage rather than a local directory, because a learner restarted in another container
must find them: the run's storage is the one thing every role shares.

Kept: the newest `keep_last`, plus the best by evaluation: the newest checkpoint whose
policy version is at most the best-evaluated version (the weights that scored best, or the
training state just before them).

With a mirror directory (`checkpoint.dir`), every checkpoint is also written there as a file
`<prefix>-<train iteration>.safetensors` holding the very same bytes (written whole, then
renamed into place), and deleted when storage's copy is pruned: files to copy, archive or
load elsewhere. Storage stays the one a learner resumes from. `read_index` reads what a store
kept without torch, for the `rlfleet checkpoints` command and `rlfleet resume`.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from rlfleet.shared.contract.codec import decode_weights, encode_weights
from rlfleet.shared.infra.storage import Storage

if TYPE_CHECKING:
    import torch

log = logging.getLogger("rlfleet.learner")


@dataclass
class CheckpointInfo:
    name: str
    train_iterations: int
    policy_version: int
    saved_at: float

    @property
    def file_name(self) -> str:
        """Its name in a mirror directory (`checkpoint.dir`)."""
        return f"{self.name}{FILE_SUFFIX}"


FILE_SUFFIX = ".safetensors"
HOOKS_META = "hooks"  # the learner hooks' states, JSON, in a checkpoint's metadata


@dataclass
class CheckpointIndex:
    """What a store keeps, oldest first, and the name of the one kept as the best."""

    entries: list[CheckpointInfo] = field(default_factory=list)
    best: str | None = None


def index_name(prefix: str) -> str:
    return f"{prefix}-index"


def read_index(storage: Storage, prefix: str = "ckpt") -> CheckpointIndex:
    """The checkpoints a store under `prefix` kept in `storage` (none: an empty index)."""
    raw = storage.get_blob(index_name(prefix))
    if raw is None:
        return CheckpointIndex()
    data = json.loads(raw)
    return CheckpointIndex([CheckpointInfo(**e) for e in data.get("checkpoints", [])],
                           data.get("best"))


class CheckpointStore:
    def __init__(self, storage: Storage, prefix: str = "ckpt", keep_last: int = 3,
                 metadata: Mapping[str, str] | None = None,
                 mirror_dir: str | Path | None = None) -> None:
        self.storage = storage
        self.prefix = prefix
        self.keep_last = max(1, keep_last)
        self.metadata = dict(metadata or {})
        self.index_name = index_name(prefix)
        self.mirror_dir = Path(mirror_dir) if mirror_dir is not None else None
        index = read_index(storage, prefix)
        self.entries: list[CheckpointInfo] = index.entries
        self.best: str | None = index.best

    def _write_index(self) -> None:
        body = {"checkpoints": [asdict(e) for e in self.entries], "best": self.best}
        self.storage.put_blob(self.index_name, json.dumps(body).encode())

    def save(self, state: Mapping[str, torch.Tensor], train_iterations: int,
             policy_version: int, extra: Mapping[str, str] | None = None) -> CheckpointInfo:
        """`extra`: more string metadata (the learner hooks' states, `HOOKS_META`)."""
        info = CheckpointInfo(f"{self.prefix}-{train_iterations:012d}", train_iterations,
                              policy_version, time.time())
        meta = {**self.metadata, **(extra or {}), "train_iterations": str(train_iterations),
                "policy_version": str(policy_version), "saved_at": f"{info.saved_at:.3f}"}
        blob = encode_weights(state, meta)
        self.storage.put_blob(info.name, blob)
        self._mirror(info, blob)
        self.entries = [e for e in self.entries if e.name != info.name] + [info]
        self._prune()
        self._write_index()
        return info

    def _mirror(self, info: CheckpointInfo, blob: bytes) -> None:
        """The checkpoint's file in the mirror directory: written whole under a temporary
        name, then renamed, so a reader never sees half a file. A failure is logged: storage
        holds the checkpoint all the same."""
        if self.mirror_dir is None:
            return
        path = self.mirror_dir / info.file_name
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            self.mirror_dir.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(blob)
            os.replace(tmp, path)
        except OSError:
            log.exception("checkpoint %s not written to %s", info.name, self.mirror_dir)
            if tmp.is_file():
                tmp.unlink()

    def mark_best(self, policy_version: int) -> str | None:
        """Protect the newest checkpoint at or before `policy_version` from pruning."""
        candidates = [e for e in self.entries if e.policy_version <= policy_version]
        if not candidates:
            return None
        best = max(candidates, key=lambda e: e.train_iterations).name
        if best != self.best:
            self.best = best
            self._prune()
            self._write_index()
        return best

    def _prune(self) -> None:
        keep = {e.name for e in self.entries[-self.keep_last:]}
        if self.best is not None:
            keep.add(self.best)
        for e in self.entries:
            if e.name not in keep:
                try:
                    self.storage.delete_blob(e.name)
                except Exception:  # an undeleted old checkpoint only costs space; logged
                    log.exception("could not delete checkpoint %s", e.name)
                if self.mirror_dir is not None:
                    try:
                        (self.mirror_dir / e.file_name).unlink(missing_ok=True)
                    except OSError:  # as above
                        log.exception("could not delete %s", self.mirror_dir / e.file_name)
        self.entries = [e for e in self.entries if e.name in keep]

    def latest(self) -> tuple[dict[str, torch.Tensor], dict[str, str]] | None:
        """The newest checkpoint that can be read, or None."""
        for info in reversed(self.entries):
            blob = self.storage.get_blob(info.name)
            if blob is not None:
                return decode_weights(blob)
            log.warning("checkpoint %s is listed but missing", info.name)
        return None
