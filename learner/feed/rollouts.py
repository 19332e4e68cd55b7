"""Feeding an on-policy learner: whole chunks from a queue buffer, gathered into rollouts.

In a learner group the coordinator cuts the rollouts itself and deals each one's chunks out
among the ranks (`next_share`): every rank learns on its share of rollout k together, even a
share that is empty or all stale (the collectives need every rank).

Each chunk the coordinator hands out is used by exactly one learn round, or dropped here if
the policy that acted it is more than `max_policy_lag` versions older than the learner's
(the coordinator's queue drops by the same rule before handing out; the learner checks again
because versions move on while a rollout fills). Either way the chunk is reported consumed,
so the queue releases it. Lag is measured per transition and reported as a metric.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from rlfleet.shared.contract.codec import decode_arrays
from rlfleet.shared.contract.frames import FRAMES, INDEX, is_packed, unpack
from rlfleet.shared.contract.wire.base import API
from rlfleet.shared.contract.wire.sampling import Consumed, MixShare, SampleRequest, SampleResponse
from rlfleet.shared.infra.http import HttpClient, HttpError
from rlfleet.shared.infra.storage import ChunkNotFound, Storage, StorageError

log = logging.getLogger("rlfleet.learner")
# After a failed sample request (not a rate limit): a coordinator that is restarting answers
# "connection refused" at once, and asking again at once fills the log with thousands of lines.
ERROR_PAUSE_S = 0.25


def is_stale(chunk_version: int, learner_version: int, max_lag: int | None) -> bool:
    """A chunk acted by a policy more than `max_lag` versions behind the learner's."""
    return max_lag is not None and learner_version - chunk_version > max_lag


def concat_chunks(chunks: list[dict[str, np.ndarray]], packed: bool = False
                  ) -> dict[str, torch.Tensor]:
    """One rollout from whole chunks, in order: the fields every chunk has, concatenated.
    Stacked frames are rebuilt here, or with `packed` (a GPU learner: `expand_frames` on
    the device) kept as each distinct frame once, the indices moved to the joined frames."""
    if packed and chunks and all(is_packed(c) for c in chunks):
        return _concat_packed(chunks)
    chunks = [unpack(c) for c in chunks]
    fields = set.intersection(*(set(c) for c in chunks))
    return {f: torch.from_numpy(np.concatenate([c[f] for c in chunks])) for f in sorted(fields)}


def _concat_packed(chunks: list[dict[str, np.ndarray]]) -> dict[str, torch.Tensor]:
    fields = set.intersection(*(set(c) for c in chunks))
    out: dict[str, np.ndarray] = {}
    base = 0
    shifted: dict[str, list[np.ndarray]] = {i: [] for i in INDEX.values()}
    for c in chunks:
        for index in INDEX.values():
            shifted[index].append(c[index].astype(np.int64) + base)
        base += len(c[FRAMES])
    for f in sorted(fields):
        out[f] = (np.concatenate(shifted[f]) if f in shifted
                  else np.concatenate([c[f] for c in chunks]))
    return {f: torch.from_numpy(a) for f, a in out.items()}


@dataclass
class RolloutBatch:
    data: dict[str, torch.Tensor]
    chunk_ids: list[str]
    rows: int
    lag_mean: float
    lag_max: int


@dataclass
class RolloutFeeder:
    client: HttpClient
    storage: Storage
    worker_id: str
    buffer: str
    rollout_size: int
    max_policy_lag: int | None
    chunks_per_request: int = 64
    dropped_chunks: int = 0
    dropped_rows: int = 0
    stop_run: bool = False
    consumed: list[str] = field(default_factory=list)  # used or dropped, not yet reported
    _pending: list[tuple[str, dict[str, np.ndarray], int]] = field(default_factory=list)
    _rows: int = 0
    _unread: list[str] = field(default_factory=list)  # handed out, storage was out: read later
    cursor: int = 0  # group mode: the next rollout wanted
    group_ended: bool = False  # group mode: the coordinator answered 409 (a new generation)
    broken: str | None = None  # group mode: why this rank must leave its generation itself
    moments: list[dict] = field(default_factory=list)  # algo.obs_norm: chunks' raw-obs counts
    packed: bool = False  # keep frames packed (a GPU learner stacks them on the device)

    def _note_moments(self, chunk_id: str, meta: dict[str, str]) -> None:
        """A chunk's raw-observation moments (algo.obs_norm), stale or not: they describe
        the env, not the policy. A malformed entry is skipped with a warning."""
        raw = meta.get("obs_moments")
        if raw is None:
            return
        try:
            moments = json.loads(raw)
        except json.JSONDecodeError:
            log.warning("chunk %s: obs_moments is not JSON: skipped", chunk_id)
            return
        self.moments.append(moments)

    def take_moments(self) -> list[dict]:
        out, self.moments = self.moments, []
        return out

    def take_consumed(self) -> list[Consumed]:
        out = [Consumed(buffer=self.buffer, chunk_ids=self.consumed)] if self.consumed else []
        self.consumed = []
        return out

    def give_back(self, consumed: list[Consumed]) -> None:
        """Reports that did not reach the coordinator: send them with the next one."""
        for c in consumed:
            self.consumed = list(c.chunk_ids) + self.consumed

    def _fetch(self, learner_version: int) -> None:
        """One sample request: whole chunks, oldest first (waits up to 1 s for some)."""
        if self._unread:  # chunks handed out during a storage outage come first
            chunk_ids, self._unread = self._unread, []
        else:
            req = SampleRequest(worker_id=self.worker_id, batch_size=1,
                                num_batches=self.chunks_per_request, wait_s=1.0,
                                mix=[MixShare(buffer=self.buffer, fraction=1.0)])
            try:
                resp = self.client.post(f"{API}/sample", req, SampleResponse, timeout_s=15,
                                        retries=0)
            except HttpError as err:
                if err.status != 429:  # a coordinator away: ask again in a moment, not at once
                    log.warning("sample request failed: %s", err)
                    time.sleep(ERROR_PAUSE_S)
                return
            self.stop_run = self.stop_run or resp.stop
            # A restarted coordinator hands out again what was in flight: never twice here.
            held = {cid for cid, _, _ in self._pending}
            chunk_ids = [cid for cid in resp.chunk_ids if cid not in held]
        if not chunk_ids:
            return
        try:
            blobs = self._read(chunk_ids)
        except StorageError as err:
            log.warning("could not read %d handed-out chunks (kept): %s", len(chunk_ids), err)
            self._unread = chunk_ids
            return
        for cid, blob in zip(chunk_ids, blobs, strict=True):
            if not blob:
                self.consumed.append(cid)
                continue
            arrays, meta = decode_arrays(blob)
            self._note_moments(cid, meta)
            version = int(meta.get("policy_version", "-1"))
            rows = int(len(arrays["reward"]))
            if is_stale(version, learner_version, self.max_policy_lag):
                self.dropped_chunks += 1
                self.dropped_rows += rows
                self.consumed.append(cid)
                continue
            self._pending.append((cid, arrays, version))
            self._rows += rows

    def next_share(self, generation: int, learner_version: int) -> RolloutBatch | None:
        """This rank's share of group rollout `cursor` (its data `{}` when the share is empty
        or all stale), or None if it is not there yet (or the group moved on)."""
        req = SampleRequest(worker_id=self.worker_id, batch_size=1, num_batches=1, wait_s=1.0,
                            mix=[MixShare(buffer=self.buffer, fraction=1.0)],
                            group_generation=generation, group_cursor=self.cursor)
        try:
            resp = self.client.post(f"{API}/sample", req, SampleResponse, timeout_s=15,
                                    retries=0)
        except HttpError as err:
            if err.status == 409:
                self.group_ended = True
                if err.body.get("field") == "group_cursor":
                    self.broken = f"out of step with the group: {err}"
            elif err.status != 429:
                log.warning("sample request failed: %s", err)
                time.sleep(ERROR_PAUSE_S)
            return None
        self.stop_run = self.stop_run or resp.stop
        if resp.first_seq != self.cursor:
            return None
        try:
            blobs = self._read(resp.chunk_ids)
        except StorageError as err:  # asked again for the same share once storage is back
            log.warning("could not read a rollout share of %d chunks: %s", len(resp.chunk_ids),
                        err)
            return None
        self.cursor += 1
        kept, ids = [], []
        for cid, blob in zip(resp.chunk_ids, blobs, strict=True):
            self.consumed.append(cid)
            if not blob:
                continue
            arrays, meta = decode_arrays(blob)
            self._note_moments(cid, meta)
            version = int(meta.get("policy_version", "-1"))
            if is_stale(version, learner_version, self.max_policy_lag):
                self.dropped_chunks += 1
                self.dropped_rows += len(arrays["reward"])
                continue
            kept.append((arrays, version))
            ids.append(cid)
        if not kept:
            return RolloutBatch({}, [], 0, 0.0, 0)
        lengths = np.array([len(a["reward"]) for a, _ in kept])
        lags = np.array([max(0, learner_version - v) for _, v in kept])
        return RolloutBatch(concat_chunks([a for a, _ in kept], self.packed), ids,
                            int(lengths.sum()),
                            float((lags * lengths).sum() / lengths.sum()), int(lags.max()))

    def _read(self, chunk_ids: list[str]) -> list[bytes]:
        """The chunks' bytes; b"" for one that is missing (cannot happen to a chunk in
        flight, but must not wedge the learner)."""
        try:
            return self.storage.get_chunks(chunk_ids)
        except ChunkNotFound as err:
            log.warning("a handed-out chunk is missing (%s); reading one by one", err)
        blobs = []
        for cid in chunk_ids:
            try:
                blobs.append(self.storage.get_chunk(cid))
            except ChunkNotFound:
                blobs.append(b"")
        return blobs

    def next(self, learner_version: int, attempts: int = 1) -> RolloutBatch | None:
        """A full rollout (at least `rollout_size` rows of whole chunks) or None if it is not
        full after `attempts` requests. Chunks that went stale while waiting are dropped."""
        for _ in range(attempts):
            if self._rows >= self.rollout_size:
                break
            self._fetch(learner_version)
        keep = []
        for cid, arrays, version in self._pending:
            if is_stale(version, learner_version, self.max_policy_lag):
                self.dropped_chunks += 1
                self.dropped_rows += len(arrays["reward"])
                self._rows -= len(arrays["reward"])
                self.consumed.append(cid)
            else:
                keep.append((cid, arrays, version))
        self._pending = keep
        if self._rows < self.rollout_size or not keep:
            return None
        data = concat_chunks([a for _, a, _ in keep], self.packed)
        lengths = np.array([len(a["reward"]) for _, a, _ in keep])
        lags = np.array([max(0, learner_version - v) for _, _, v in keep])
        ids = [cid for cid, _, _ in keep]
        self._pending, self._rows = [], 0
        self.consumed.extend(ids)
        return RolloutBatch(data, ids, int(lengths.sum()),
                            float((lags * lengths).sum() / lengths.sum()), int(lags.max()))
