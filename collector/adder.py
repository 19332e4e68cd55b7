"""The collector's adder: write a chunk to storage, then announce its metadata.

Announcing happens on a reporter thread that batches whatever metadata is waiting into one
`POST /chunks`, so the env loop never waits on HTTP and the coordinator sees tens of requests
per second however fast the envs run. A chunk is announced only after its write returned, and
metadata that could not be delivered is kept and sent again: nothing acknowledged is lost,
and the coordinator ignores a chunk id it already holds, so a retry cannot count twice.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable, Mapping

import numpy as np

from shared.codec import encode_arrays
from shared.http import HttpClient, HttpError
from shared.schemas import API, ChunkMeta, ChunkReport, ChunkReportResponse
from shared.storage import Storage

log = logging.getLogger("rlfleet.collector")


class StorageAdder:
    def __init__(self, storage: Storage, client: HttpClient, worker_id: Callable[[], str],
                 task_id: Callable[[], str | None], report_interval_s: float = 0.05) -> None:
        self.storage = storage
        self.client = client
        self.worker_id = worker_id
        self.task_id = task_id
        self.report_interval_s = report_interval_s
        self._q: queue.Queue[ChunkMeta | None] = queue.Queue()
        self._pending: list[ChunkMeta] = []
        self._idle = threading.Condition()
        self._unreported = 0
        self.chunks_written = 0
        self.chunks_reported = 0
        self.global_env_steps = 0
        self.throttle = threading.Event()
        self.stop = threading.Event()
        self._thread = threading.Thread(target=self._report_loop, name="reporter", daemon=True)
        self._thread.start()

    def add(self, arrays: Mapping[str, np.ndarray], policy_version: int,
            episode_returns: list[float], episode_lengths: list[int],
            segments: list[tuple[int, int]] | None = None,
            timers: dict[str, float] | None = None,
            episode_return_components: list[list[float]] | None = None) -> str:
        chunk_id = uuid.uuid4().hex
        t0 = time.perf_counter()
        blob = encode_arrays(arrays, {"policy_version": str(policy_version),
                                      "worker_id": self.worker_id() or ""})
        self.storage.put_chunk(chunk_id, blob)
        # ms per vector step, like the rollout's timers, so the phases add up per step
        timers = dict(timers or {})
        steps = max(1.0, timers.pop("vector_steps", 1.0))
        timers["write_ms"] = 1000.0 * (time.perf_counter() - t0) / steps
        self.chunks_written += 1
        with self._idle:
            self._unreported += 1
        self._q.put(ChunkMeta(chunk_id=chunk_id, length=int(len(arrays["reward"])),
                              policy_version=policy_version, episode_returns=episode_returns,
                              episode_lengths=episode_lengths, segments=segments or [],
                              timers=timers,
                              episode_return_components=episode_return_components or []))
        return chunk_id

    def _report_loop(self) -> None:
        closing = False
        while not closing:
            try:
                item = self._q.get(timeout=0.5)  # on timeout, retry what is pending
            except queue.Empty:
                item = ...
            closing = item is None
            if isinstance(item, ChunkMeta):
                self._pending.append(item)
            # Gather whatever else arrives within the report interval into the same request.
            deadline = time.monotonic() + self.report_interval_s
            while not closing and len(self._pending) < 1000:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    more = self._q.get(timeout=left)
                except queue.Empty:
                    break
                if more is None:
                    closing = True
                else:
                    self._pending.append(more)
            self._send()

    def _send(self) -> None:
        task_id = self.task_id()
        if not self._pending or task_id is None:
            return
        batch = self._pending[:10_000]
        try:
            resp = self.client.post(f"{API}/chunks", ChunkReport(
                worker_id=self.worker_id(), task_id=task_id, chunks=batch), ChunkReportResponse)
        except HttpError as err:
            log.warning("could not report %d chunks (kept for the next try): %s",
                        len(batch), err)
            return
        del self._pending[:len(batch)]
        self.chunks_reported += len(batch)
        self.global_env_steps = max(self.global_env_steps, resp.env_steps)
        if resp.throttle_s > 0:
            self.throttle.set()
        if resp.stop:
            self.stop.set()
        with self._idle:
            self._unreported -= len(batch)
            self._idle.notify_all()

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every written chunk is announced; False if that did not happen."""
        with self._idle:
            return self._idle.wait_for(lambda: self._unreported == 0, timeout)

    def close(self, timeout: float = 10.0) -> bool:
        flushed = self.flush(timeout)
        self._q.put(None)
        self._thread.join(timeout=5)
        return flushed
