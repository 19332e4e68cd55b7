"""The learner's sample loop: sample references from the coordinator, chunks from storage.

It asks for many batches per request, reads the chunks it does not have cached (chunks never
change, so the cache needs no invalidation, only an LRU bound) and turns each answer, with the
chunks' columns, into batches (`assemble`) that it passes on (`hand`). Where the batches go is
the subclass's business: a queue of torch batches in the learner's own process
(`learner/feed/prefetch.py`), or shared memory written by a data process of its own
(`learner/feed/dataproc.py`). This module imports no torch, so a data process starts in a fraction
of a second and costs little memory.

In a learner group (`group`: generation and world size) each request names the next group
batch wanted (a cursor) and the answer is this rank's shard of the group's batches, so the
k-th batch delivered is shard `rank` of group batch k on every rank. An answer that does not
start where the cursor is (a lost one was answered again) is dropped; a 409 means the group
has moved on to another generation, and the loop stops (`group_ended`).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from rlfleet.shared.batching.arena import ChunkArena
from rlfleet.shared.batching.transforms import BatchTransforms
from rlfleet.shared.contract.codec import CodecError, decode_arrays
from rlfleet.shared.contract.sample_wire import MEDIA_TYPE, decode_sample
from rlfleet.shared.contract.wire.base import API
from rlfleet.shared.contract.wire.sampling import (
    MAX_SAMPLE_ITEMS,
    MixShare,
    SampleRequest,
    SampleResponse,
    sample_items,
)
from rlfleet.shared.infra.http import HttpClient, HttpError
from rlfleet.shared.infra.storage import ChunkNotFound, Storage, StorageError

log = logging.getLogger("rlfleet.learner")

class SampleLoop:
    def __init__(self, client: HttpClient, storage: Storage, worker_id: str, batch_size: int,
                 batches_per_request: int, cache_size: int,
                 mix: list[MixShare] | None = None,
                 by_buffer: dict[str, int] | None = None,
                 group_generation: int | None = None, cursor: int = 0,
                 transforms: BatchTransforms | None = None) -> None:
        """`transforms`: n-step returns, hindsight relabelling, per-buffer rewards, applied
        as batches are assembled (`shared/batching/transforms.py`); None: rows as stored."""
        self.client = client
        self.transforms = transforms
        self.worker_id = worker_id
        self.batch_size = batch_size
        self.batches_per_request = batches_per_request
        self.storage = storage
        self.arena = ChunkArena(self._read_chunks, cache_size)
        # algo.obs_norm: the raw-observation counts of the chunks read so far, not yet taken
        self._moments: list[dict] = []
        self._moments_lock = threading.Lock()
        self.mix = mix
        self.by_buffer = by_buffer
        self.rate_limited = 0
        self.stop_run = threading.Event()
        self._closing = threading.Event()
        self.dropped_responses = 0
        self.sample_wait_s = 0.0
        self.fetch_s = 0.0
        self.group_generation = group_generation
        self.cursor = cursor  # group mode: the next group batch wanted
        self.group_ended = threading.Event()
        self.broken: str | None = None  # why this rank must leave its generation itself
        self.seen_generation: int | None = None  # what the last answer said the group is at

    def _read_chunks(self, ids: list[str]) -> list[dict[str, np.ndarray]]:
        """The chunks' columns; each chunk's raw-observation counts (`obs_moments`, sent
        with it when the run normalises observations) are kept for `take_moments`. A chunk
        is read again only after the arena let it go, so its counts are counted once unless
        it is sampled long after (they describe the env, so a repeat only reweights)."""
        out = []
        for blob in self.storage.get_chunks(ids):
            arrays, meta = decode_arrays(blob)
            raw = meta.get("obs_moments")
            if raw is not None:
                try:
                    moments = json.loads(raw)
                except json.JSONDecodeError:
                    log.warning("a chunk's obs_moments is not JSON: skipped")
                else:
                    with self._moments_lock:
                        self._moments.append(moments)
            out.append(arrays)
        return out

    def take_moments(self) -> list[dict]:
        """The observation counts of the chunks read since the last call (algo.obs_norm:
        the learner merges them into the statistics it publishes)."""
        with self._moments_lock:
            out, self._moments = self._moments, []
        return out

    def assemble(self, resp: SampleResponse, columns: Mapping[str, np.ndarray],
                 offsets: np.ndarray) -> Any:
        """Turn one answer into batches (chunk k's rows start at `columns[f][offsets[k]]`)."""
        raise NotImplementedError

    def hand(self, batches: Any) -> None:
        """Pass assembled batches on; may block (that is the back pressure) but must return
        soon once `_closing` is set."""
        raise NotImplementedError

    def on_change(self) -> None:
        """Called after the loop's state (flags, counters) changed outside `hand`."""

    def wait_room(self) -> bool:
        """Block until an answer could be handed on (False: closing). Sampling only then
        keeps the batches sampled but not yet learned from, which the rate limiter counts as
        learned, to what is held ready."""
        return True

    def request(self, wait_s: float = 1.0) -> SampleRequest:
        """The sample request this loop sends (fewer batches where big batches would pass
        the coordinator's cap)."""
        per_batch = sample_items(self.batch_size, 1, self.by_buffer)
        num_batches = max(1, min(self.batches_per_request, MAX_SAMPLE_ITEMS // per_batch))
        return SampleRequest(worker_id=self.worker_id, batch_size=self.batch_size,
                             num_batches=num_batches, wait_s=wait_s, mix=self.mix,
                             by_buffer=self.by_buffer)

    def run(self) -> None:
        req = self.request()
        while not self._closing.is_set() and not self.group_ended.is_set():
            if not self.wait_room() or not self.sample_once(req):
                break

    def sample_once(self, req: SampleRequest) -> bool:
        """One request and what it brings handed on (`hand`); False when this loop is done
        (its group moved on)."""
        grouped = self.group_generation is not None
        if grouped:
            req = req.model_copy(update={"group_generation": self.group_generation,
                                         "group_cursor": self.cursor})
        t0 = time.perf_counter()
        try:
            resp = self.client.post(f"{API}/sample", req, SampleResponse, timeout_s=15,
                                    retries=0, accept=(MEDIA_TYPE, decode_sample))
        except CodecError as err:  # not from a coordinator of ours
            log.warning("sample answer not understood: %s", err)
            self._closing.wait(0.5)
            return True
        except HttpError as err:
            return self._refused(err, time.perf_counter() - t0)
        self.sample_wait_s += time.perf_counter() - t0
        self.seen_generation = resp.group_generation
        if resp.stop:
            self.stop_run.set()
            self.on_change()
        if not resp.chunk_ids or resp.num_batches == 0:
            return True
        if grouped:
            if resp.first_seq != self.cursor:
                log.warning("group batch %s answered for cursor %d: dropped",
                            resp.first_seq, self.cursor)
                return True
            self.cursor += resp.num_batches
        return self._read(resp)

    def _refused(self, err: HttpError, waited_s: float) -> bool:
        """A request the coordinator did not answer with batches; False when the group
        moved on."""
        if err.status == 429:  # the rate limiter says wait: the buffer is not ready
            self.rate_limited += 1
            self.sample_wait_s += waited_s
            return True
        if err.status == 409 and self.group_generation is not None:  # the group re-formed,
            log.info("sample: %s", err)  # or this rank is out of step with it: re-form
            if err.body.get("field") == "group_cursor":
                self.broken = f"out of step with the group: {err}"
            self.group_ended.set()
            self.on_change()
            return False
        log.warning("sample request failed: %s", err)
        self._closing.wait(0.5)
        return True

    def _read(self, resp: SampleResponse) -> bool:
        """The answer's chunks, read, and its batches handed on; False when the group must
        re-form (a chunk of a group batch is gone)."""
        grouped = self.group_generation is not None
        t1 = time.perf_counter()
        try:
            offsets = self.arena.offsets(resp.chunk_ids)
        except ChunkNotFound as err:
            # Evicted and deleted between sampling and reading: skip these batches (in a
            # group every rank must learn from group batch k together: re-form instead).
            self.dropped_responses += 1
            log.info("dropping a sample response: %s", err)
            if grouped:
                self.broken = f"a chunk of group batch {resp.first_seq} is gone: {err}"
                self.group_ended.set()
                self.on_change()
                return False
            return True
        except StorageError as err:  # an outage: sample afresh once it is over
            self.dropped_responses += 1
            log.warning("dropping a sample response, storage unavailable: %s", err)
            if grouped:
                self.cursor -= resp.num_batches  # ask for the same shard again
            self._closing.wait(0.5)
            return True
        batches = self.assemble(resp, self.arena.columns, offsets)
        self.fetch_s += time.perf_counter() - t1
        self.hand(batches)
        return True
