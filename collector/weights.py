"""Where a collector gets policy weights: the newest version in storage, never an older one."""

from __future__ import annotations

import time

import torch

from rlfleet.shared.contract.codec import decode_weights
from rlfleet.shared.infra.storage import Storage


class StorageWeightSource:
    def __init__(self, storage: Storage, min_interval_s: float = 0.0) -> None:
        self.storage = storage
        self.min_interval_s = min_interval_s
        self._last_look = 0.0
        self.loads = 0

    def poll(self, current_version: int, force: bool = False
             ) -> tuple[int, dict[str, torch.Tensor]] | None:
        now = time.monotonic()
        if not force and now - self._last_look < self.min_interval_s:
            return None
        self._last_look = now
        latest = self.storage.latest_version()
        if latest is None or latest <= current_version:
            return None
        got = self.storage.get_weights()
        if got is None or got[0] <= current_version:
            return None
        version, blob = got
        state, _ = decode_weights(blob)
        self.loads += 1
        return version, state
