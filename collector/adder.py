"""The collector's adder: write a chunk to storage, then announce its metadata.

Announcing happens on a reporter thread that batches whatever metadata is waiting into one
`POST /chunks`, so the env loop never waits on HTTP and the coordinator sees tens of requests
per second however fast the envs run. A chunk is announced only after its write returned, and
metadata that could not be delivered is kept and sent again: nothing acknowledged is lost,
and the coordinator ignores a chunk id it already holds, so a retry cannot count twice.

Each answer says whether the learner is behind (`throttle`, set or cleared by every answer).
While it is, the collector makes one chunk per permit and waits for that chunk's answer before
asking for the next (`flush`), so the reporter sends at once instead of gathering: a
collector's chunks cannot outrun the answers that would stop it.

Storage may be down for a while (a Redis restart, a remounted volume). Then a chunk that could
not be written is *held*: kept encoded in memory while a writer thread retries the held chunks,
oldest first, with exponential backoff and jitter (collectors that lost Redis together do not
retry together), and announces each once its write succeeded. New chunks queue behind the
held ones, so chunks reach storage in the order they were made.

At most `max_held_chunks` chunks are unacknowledged (held, or written but not yet acknowledged
by the coordinator); then `add()` waits for room, which pauses collection rather than growing
memory, storage or a backlog without bound: while the coordinator is down, a collector that
went on would flood it with work made blind to the learner's pace when it returns. A held
chunk was never announced, so losing it (the collector dies before storage comes back) loses
nothing the coordinator counted.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import EllipsisType

import numpy as np

from rlfleet.shared.contract.codec import encode_arrays
from rlfleet.shared.contract.frames import chunk_compression, pack, packable
from rlfleet.shared.contract.wire.base import API
from rlfleet.shared.contract.wire.experience import ChunkMeta, ChunkReport, ChunkReportResponse
from rlfleet.shared.contract.wire.tasks import GameRecord
from rlfleet.shared.infra.http import HttpClient, HttpError
from rlfleet.shared.infra.storage import Storage, StorageError
from rlfleet.shared.util.backoff import Backoff
from rlfleet.shared.util.moments import RunningMoments

log = logging.getLogger("rlfleet.collector")

RETRY_FIRST_S = 0.05
RETRY_MAX_S = 2.0


@dataclass(frozen=True)
class _Held:
    """A chunk storage could not take yet: its bytes, and what to announce once written."""

    chunk_id: str
    blob: bytes
    meta: ChunkMeta


class StorageAdder:
    def __init__(self, storage: Storage, client: HttpClient,
                 worker_id: Callable[[], str | None],
                 task_id: Callable[[], str | None], report_interval_s: float = 0.05,
                 max_held_chunks: int = 64,
                 on_answer: Callable[[ChunkReportResponse], None] | None = None,
                 compression: str = "auto") -> None:
        if max_held_chunks < 1:
            raise ValueError(f"max_held_chunks={max_held_chunks} must be >= 1")
        self.storage = storage
        self.client = client
        self.worker_id = worker_id
        self.task_id = task_id
        self.report_interval_s = report_interval_s
        self.max_held_chunks = max_held_chunks
        self.on_answer = on_answer  # sees every answer to a report (self-play: opponents)
        self.compression = compression
        self._q: queue.Queue[ChunkMeta | None] = queue.Queue()
        self._pending: list[ChunkMeta] = []
        # One lock for the held chunks and the announcement count: `add()` waits on it for
        # room, the writer for work, `flush()`/`close()` for everything to drain.
        self._cond = threading.Condition()
        self._held: deque[_Held] = deque()
        self._unreported = 0
        self._closing = False
        self._abandon = threading.Event()  # close() gave up: the writer stops retrying
        self._outage = False  # logging once per outage, not once per failed write
        self.chunks_written = 0
        self.chunks_reported = 0
        self.write_failures = 0
        self.global_env_steps = 0
        self.throttle = threading.Event()
        self.stop = threading.Event()
        self._thread = threading.Thread(target=self._report_loop, name="reporter", daemon=True)
        self._thread.start()
        self._writer = threading.Thread(target=self._write_loop, name="chunk-writer",
                                        daemon=True)
        self._writer.start()

    @property
    def chunks_held(self) -> int:
        """Chunks made but not yet written (storage is, or was just, unavailable)."""
        with self._cond:
            return len(self._held)

    def add(self, arrays: Mapping[str, np.ndarray], policy_version: int,
            episode_returns: list[float], episode_lengths: list[int],
            segments: list[tuple[int, int]] | None = None,
            timers: dict[str, float] | None = None,
            episode_return_components: list[list[float]] | None = None,
            games: list[GameRecord] | None = None,
            opponents_skipped: list[str] | None = None,
            obs_moments: RunningMoments | None = None,
            episode_envs: list[int] | None = None) -> str:
        """Write a chunk (or hold it, if storage cannot take it now) and queue its metadata
        for announcement once written. Never raises `StorageError`; waits while
        `max_held_chunks` are unacknowledged, until there is room or the adder is
        stopping."""
        chunk_id = uuid.uuid4().hex
        t0 = time.perf_counter()
        if packable(arrays):  # stacked frames: each one stored once
            arrays = pack(arrays)
        meta = {"policy_version": str(policy_version), "worker_id": self.worker_id() or ""}
        if obs_moments is not None:  # algo.obs_norm: the learner merges these
            meta["obs_moments"] = json.dumps(obs_moments.to_wire())
        blob = encode_arrays(arrays, meta,
                             compression=chunk_compression(self.compression, arrays))
        # ms per vector step, like the rollout's timers, so the phases add up per step
        timers = dict(timers or {})
        steps = max(1.0, timers.pop("vector_steps", 1.0))

        def encoded() -> _Held:  # the metadata's write_ms counts up to now
            timers["write_ms"] = 1000.0 * (time.perf_counter() - t0) / steps
            return _Held(chunk_id, blob, ChunkMeta(
                chunk_id=chunk_id, length=int(len(arrays["reward"])),
                policy_version=policy_version, episode_returns=episode_returns,
                episode_lengths=episode_lengths, segments=segments or [], timers=timers,
                episode_return_components=episode_return_components or [],
                games=games or [], opponents_skipped=opponents_skipped or [],
                episode_envs=episode_envs or []))

        with self._cond:
            self._cond.wait_for(lambda: len(self._held) + self._unreported
                                < self.max_held_chunks or self._closing or self.stop.is_set())
            if self._held:  # keep write order: the writer takes it after those before it
                self._held.append(encoded())
                self._cond.notify_all()
                return chunk_id
        try:
            self.storage.put_chunk(chunk_id, blob)
        except StorageError as err:
            self._write_failed(err)
            with self._cond:
                self._held.append(encoded())
                self._cond.notify_all()
            return chunk_id
        self._recovered()
        with self._cond:
            self._announce(encoded().meta)
        return chunk_id

    def halt(self) -> None:
        """Stop taking chunks: sets `stop` and wakes an `add()` waiting for room (the run
        stopped, or the collector is shutting down)."""
        self.stop.set()
        with self._cond:
            self._cond.notify_all()

    # -- writing held chunks ----------------------------------------------------------------

    def _write_loop(self) -> None:
        backoff, unexpected = Backoff(RETRY_FIRST_S, RETRY_MAX_S), False
        while not self._abandon.is_set():
            with self._cond:
                self._cond.wait_for(lambda: self._held or self._abandon.is_set())
                if self._abandon.is_set():
                    return
                held = self._held[0]
            try:
                self.storage.put_chunk(held.chunk_id, held.blob)
            except Exception as err:  # any error: a dead writer would stall collection
                if not isinstance(err, StorageError) and not unexpected:  # once a streak
                    log.exception("writing a held chunk failed unexpectedly (kept, retried)")
                unexpected = not isinstance(err, StorageError)
                self._write_failed(err)
                if self._abandon.wait(backoff.next()):
                    return
                continue
            unexpected = False
            backoff.reset()
            self._recovered()
            with self._cond:  # announced in write order: add() writes only when none held
                self._held.popleft()
                self._announce(held.meta)
                self._cond.notify_all()

    def _announce(self, meta: ChunkMeta) -> None:
        """Queue a written chunk's metadata for the reporter (called holding `_cond`)."""
        self.chunks_written += 1
        self._unreported += 1
        self._q.put(meta)

    def _write_failed(self, err: Exception) -> None:
        with self._cond:
            self.write_failures += 1
            first = not self._outage
            self._outage = True
            held = len(self._held)
        if first:
            log.warning("storage write failed; holding chunks in memory (up to %d) and "
                        "retrying: %s", self.max_held_chunks, err)
        else:
            log.debug("storage write failed again (%d held): %s", held, err)

    def _recovered(self) -> None:
        with self._cond:
            was_out, self._outage = self._outage, False
            failures = self.write_failures
        if was_out:
            log.info("storage takes chunks again (%d failed writes so far)", failures)

    # -- announcing -------------------------------------------------------------------------

    def _report_loop(self) -> None:
        closing = False
        failing = False
        while not closing:
            item: ChunkMeta | EllipsisType | None
            try:
                item = self._q.get(timeout=0.5)  # on timeout, retry what is pending
            except queue.Empty:
                item = ...
            closing = item is None
            if isinstance(item, ChunkMeta):
                self._pending.append(item)
            # Gather whatever else arrives within the report interval into the same request
            # (unless throttled: then the collector waits for this answer, nothing else comes).
            deadline = time.monotonic() + self.report_interval_s
            while not closing and len(self._pending) < 1000 and not self.throttle.is_set():
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
            try:
                self._send()
                failing = False
            except Exception:  # kept for the next try: a dead reporter would stall collection
                if not failing:  # once per streak, not every half second
                    log.exception("reporting chunks failed unexpectedly (kept for the next try)")
                failing = True

    def _send(self) -> None:
        task_id, worker_id = self.task_id(), self.worker_id()
        if not self._pending or task_id is None or worker_id is None:
            return
        batch = self._pending[:10_000]
        try:
            resp = self.client.post(f"{API}/chunks", ChunkReport(
                worker_id=worker_id, task_id=task_id, chunks=batch), ChunkReportResponse)
        except HttpError as err:
            log.warning("could not report %d chunks (kept for the next try): %s",
                        len(batch), err)
            return
        del self._pending[:len(batch)]
        self.chunks_reported += len(batch)
        self.global_env_steps = max(self.global_env_steps, resp.env_steps)
        if resp.throttle_s > 0:
            self.throttle.set()
        else:
            self.throttle.clear()
        if resp.stop:
            self.halt()
        if self.on_answer is not None:
            self.on_answer(resp)
        with self._cond:
            self._unreported -= len(batch)
            self._cond.notify_all()

    # -- draining ---------------------------------------------------------------------------

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every written chunk is announced; False if that did not happen.
        (Held chunks are not written yet: `close()` is what waits for them.)"""
        with self._cond:
            return self._cond.wait_for(lambda: self._unreported == 0, timeout)

    def close(self, timeout: float = 10.0) -> bool:
        """Write what is held and announce everything written, within `timeout`; True if
        all of it was. Chunks still held then are dropped (and counted in the log): they
        were never announced, so the coordinator counted none of them."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            written = self._cond.wait_for(lambda: not self._held, timeout)
        flushed = self.flush(max(0.0, deadline - time.monotonic()))
        self._abandon.set()
        with self._cond:
            self._cond.notify_all()
            unwritten = len(self._held)
        self._writer.join(timeout=1)  # it may be inside a storage call that is retrying
        self._q.put(None)
        self._thread.join(timeout=5)
        if unwritten:
            log.warning("closing with %d chunks never written (storage was unavailable); "
                        "they were never announced, so nothing acknowledged is lost",
                        unwritten)
        return written and flushed
