"""Keeping the learner fed from a thread of its own process (`learner.data_process: false`).

The sample loop (`learner/feed/sampling.py`) runs on a background thread, builds torch batches
and parks them in a bounded queue; the training loop only ever takes ready batches. Simple,
and enough for large networks; with small ones the thread's JSON and numpy work competes with
the training thread for the GIL, which is why a data process (`learner/feed/dataproc.py`) is the
default.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from rlfleet.learner.feed.sampling import SampleLoop
from rlfleet.learner.output.publisher import StorageSink, WeightSink
from rlfleet.shared.batching.batching import Batch, assemble_from
from rlfleet.shared.batching.rows import batch_fields
from rlfleet.shared.contract.wire.sampling import SampleResponse
from rlfleet.shared.infra.storage import Storage


class Prefetcher(SampleLoop):
    """The sample loop on a thread of this process; a `Feed`."""

    def __init__(self, *args: Any, depth: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ready: queue.Queue[list] = queue.Queue(maxsize=depth)
        self._thread = threading.Thread(target=self._run, name="prefetch", daemon=True)

    def start(self) -> Prefetcher:
        self._thread.start()
        return self

    def get(self, timeout: float) -> list[Batch] | list[dict[str, Batch]] | None:
        try:
            return self.ready.get(timeout=timeout)
        except queue.Empty:
            return None

    def _run(self) -> None:
        torch.set_num_threads(1)
        self.run()

    def assemble(self, resp: SampleResponse, columns: Mapping[str, np.ndarray],
                 offsets: np.ndarray) -> list:
        return assemble_from(columns, offsets, resp.parts, resp.num_batches,
                             batch_fields(columns), by_key=self.by_buffer is not None,
                             transforms=self.transforms)

    def hand(self, batches: list) -> None:
        while not self._closing.is_set():
            try:
                self.ready.put(batches, timeout=0.5)
                return
            except queue.Full:
                continue

    def weight_sink(self, storage: Storage) -> WeightSink:
        """The publish thread writes versions to storage itself."""
        return StorageSink(storage)

    def close(self, wait: bool = True) -> None:
        self._closing.set()
        if wait:
            self._thread.join(timeout=20)


class InlineFeed(Prefetcher):
    """The sample loop run on the training thread itself, one request per `get`: no thread
    to compete with the updates for the interpreter, at the price of the sampling's time in
    the loop. What the single-process runner's learner uses, where every thread of the
    cluster shares one process."""

    def start(self) -> InlineFeed:
        return self

    def get(self, timeout: float) -> list[Batch] | list[dict[str, Batch]] | None:
        self._ready: list | None = None
        if not self._closing.is_set():
            self.sample_once(self.request(wait_s=timeout))
        ready, self._ready = self._ready, None
        return ready

    def hand(self, batches: list) -> None:
        self._ready = batches

    def close(self, wait: bool = True) -> None:
        self._closing.set()
