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
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass

import torch

from rlfleet.shared.contract.codec import decode_weights, encode_weights
from rlfleet.shared.infra.storage import Storage

log = logging.getLogger("rlfleet.learner")


@dataclass
class CheckpointInfo:
    name: str
    train_iterations: int
    policy_version: int
    saved_at: float


class CheckpointStore:
    def __init__(self, storage: Storage, prefix: str = "ckpt", keep_last: int = 3,
                 metadata: Mapping[str, str] | None = None) -> None:
        self.storage = storage
        self.prefix = prefix
        self.keep_last = max(1, keep_last)
        self.metadata = dict(metadata or {})
        self.index_name = f"{prefix}-index"
        self.entries: list[CheckpointInfo] = []
        self.best: str | None = None
        self._read_index()

    def _read_index(self) -> None:
        raw = self.storage.get_blob(self.index_name)
        if raw is None:
            return
        data = json.loads(raw)
        self.entries = [CheckpointInfo(**e) for e in data.get("checkpoints", [])]
        self.best = data.get("best")

    def _write_index(self) -> None:
        body = {"checkpoints": [asdict(e) for e in self.entries], "best": self.best}
        self.storage.put_blob(self.index_name, json.dumps(body).encode())

    def save(self, state: Mapping[str, torch.Tensor], train_iterations: int,
             policy_version: int) -> CheckpointInfo:
        info = CheckpointInfo(f"{self.prefix}-{train_iterations:012d}", train_iterations,
                              policy_version, time.time())
        meta = {**self.metadata, "train_iterations": str(train_iterations),
                "policy_version": str(policy_version), "saved_at": f"{info.saved_at:.3f}"}
        self.storage.put_blob(info.name, encode_weights(state, meta))
        self.entries = [e for e in self.entries if e.name != info.name] + [info]
        self._prune()
        self._write_index()
        return info

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
        self.entries = [e for e in self.entries if e.name in keep]

    def latest(self) -> tuple[dict[str, torch.Tensor], dict[str, str]] | None:
        """The newest checkpoint that can be read, or None."""
        for info in reversed(self.entries):
            blob = self.storage.get_blob(info.name)
            if blob is not None:
                return decode_weights(blob)
            log.warning("checkpoint %s is listed but missing", info.name)
        return None
