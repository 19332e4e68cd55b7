"""The coordinator's replay: named buffers, their rate limiters, and the chunk registry.

Callers hold one lock around every method (the coordinator's condition), so the buffers,
their limiters and the registry always change together.

The replay also keeps the *ledger*: every chunk the coordinator acknowledged is either still
in some buffer or was let go of for a counted reason (evicted, consumed, dropped/<reason>).
A chunk in several buffers is counted once, when the last of them lets go, under that
buffer's reason; so `acknowledged == in_buffers + evicted + consumed + dropped` at every
moment the lock is free.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from rlfleet.shared.contract.algo import PrioritySettings, RolloutSettings
from rlfleet.shared.contract.codec import decode_arrays, encode_arrays
from rlfleet.shared.contract.config import MixPart
from rlfleet.shared.contract.wire.experience import ChunkMeta
from rlfleet.shared.contract.wire.sampling import (
    Consumed,
    MixShare,
    PriorityUpdate,
    SampleRequest,
)
from rlfleet.shared.infra.storage import Storage
from rlfleet.shared.infra.webapp import BadRequest
from rlfleet.shared.replay.buffers import (
    Buffer,
    ChunkInfo,
    ChunkRegistry,
    RateLimiter,
    make_buffer,
    make_limiter,
)
from rlfleet.shared.replay.buffers.dataset import DatasetBuffer
from rlfleet.shared.replay.buffers.episode import EpisodeBuffer
from rlfleet.shared.replay.buffers.queue import QueueBuffer
from rlfleet.shared.replay.buffers.ring import PrioritizedBuffer
from rlfleet.shared.replay.buffers.sequence import SequenceBuffer
from rlfleet.shared.run.config import RunConfig

log = logging.getLogger("rlfleet.coordinator")


class UnknownBuffer(KeyError):
    def __init__(self, name: str, field: str) -> None:
        super().__init__(name)
        self.name, self.field = name, field

    def __str__(self) -> str:
        return f"buffer '{self.name}' does not exist"


class BufferRefused(ValueError):
    """A clear or a load the named buffer cannot take (409), whatever the request says."""

    def __init__(self, name: str, why: str) -> None:
        super().__init__(f"buffer '{name}' {why}")
        self.name = name


class ReadOnlyBuffer(BufferRefused):
    """A dataset buffer: its items are its dataset, never cleared or loaded into."""

    def __init__(self, name: str) -> None:
        super().__init__(name, "is a dataset buffer: its items are its dataset, and it "
                         "cannot be cleared or loaded into")


class StaleLoad(BufferRefused):
    """Rows loaded into a queue buffer that drops stale data would all be dropped: they
    were acted by another run's policies, which no policy lag of this run covers."""

    def __init__(self, name: str, setting: str, lag: int) -> None:
        super().__init__(name, f"is a queue buffer whose rows are dropped when stale "
                         f"({setting}={lag}), and loaded rows were acted by another run's "
                         "policies (policy version -1): every one would be dropped; load "
                         f"them into a run without {setting}")


@dataclass(frozen=True)
class PartPlan:
    buffer: str
    key: str | None
    batch_size: int


@dataclass
class PartRefs:
    """One buffer's share of a sample, as numpy arrays (the route turns them into lists)."""

    buffer: str
    key: str | None
    chunk_index: np.ndarray
    rows: np.ndarray
    item_ids: np.ndarray
    weights: np.ndarray | None
    sequence_length: int | None
    lengths: np.ndarray | None


class SampleCounter(Protocol):
    """Who counts every sample handed out (the coordinator's batch log)."""

    def on_sample(self, buffer: str, item_ids: np.ndarray, train_iteration: int) -> None:
        """`item_ids` of `buffer` were handed out at `train_iteration`."""

    def on_clear(self, buffer: str) -> None:
        """`buffer` was emptied: its item ids start again at 0."""


class Replay:
    def __init__(self, cfg: RunConfig, storage: Storage | None = None,
                 counter: SampleCounter | None = None) -> None:
        """`storage` is where dataset buffers store their dataset's chunks (needed only for
        a config with `kind: dataset` buffers); `counter` counts every sample handed out
        (`logging.batch_log`; None: nothing counts them)."""
        self.cfg = cfg
        self.buffers: dict[str, Buffer] = {}
        self.limiters: dict[str, RateLimiter] = {}
        # the algorithm's |TD error| offset, where it has one (a prioritized buffer's floor)
        priority_eps = (cfg.algo.priority_eps if isinstance(cfg.algo, PrioritySettings)
                        else 1e-6)
        for i, (name, bcfg) in enumerate(cfg.buffers.items()):
            seed = cfg.seed * 1009 + i
            if bcfg.kind == "dataset":
                # here, not at the top: it imports gymnasium, which a coordinator without
                # dataset buffers never needs at start-up
                from rlfleet.shared.replay.datasets import load_dataset_buffer

                if storage is None:
                    raise ValueError(f"buffers.{name}: a dataset buffer needs storage")
                self.buffers[name] = load_dataset_buffer(name, bcfg, cfg, storage, seed)
            else:
                self.buffers[name] = make_buffer(name, bcfg, seed, priority_eps)
            self.limiters[name] = make_limiter(bcfg)
        self.insert_into = list(cfg.receiving_buffers)
        self.registry = ChunkRegistry()
        self.generation = 0  # of the last snapshot written or loaded
        self.released_by: Counter[str] = Counter()  # the ledger: chunks let go of, by reason
        self.holders: dict[str, str] = {}  # queue chunk in flight -> the learner holding it
        self.batch_log = counter

    def __contains__(self, chunk_id: str) -> bool:
        return chunk_id in self.registry

    def size(self) -> int:
        return sum(len(b) for b in self.buffers.values())

    # -- inserting --------------------------------------------------------------------------

    def unseen(self, metas: list[ChunkMeta]) -> list[ChunkMeta]:
        """The chunks not held or released lately: a retried report, or an id listed twice,
        counts once."""
        fresh: list[ChunkMeta] = []
        seen: set[str] = set()
        for m in metas:
            if not self.registry.seen(m.chunk_id) and m.chunk_id not in seen:
                seen.add(m.chunk_id)
                fresh.append(m)
        return fresh

    def insert(self, metas: list[ChunkMeta], train_iteration: int) -> tuple[list[ChunkMeta],
                                                                            list[str]]:
        """Index new chunks in every receiving buffer; returns (the chunks that were new,
        the chunk ids no buffer refers to any more, to delete from storage)."""
        fresh = self.unseen(metas)
        if not fresh:
            return [], []
        infos = [ChunkInfo(m.chunk_id, m.length, m.policy_version,
                           tuple((start, n) for start, n in m.segments)) for m in fresh]
        for info in infos:
            self.registry.hold(info.chunk_id, len(self.insert_into))
        dead: list[str] = []
        for name in self.insert_into:
            dead += self._settle(self.buffers[name],
                                 self.buffers[name].insert(infos, train_iteration))
        return fresh, dead

    def _settle(self, buf: Buffer, released: list[str]) -> list[str]:
        """Drop the buffer's references; count in the ledger, under the buffer's reason,
        each chunk that no buffer holds any more. Returns those ids (to delete)."""
        if not released:
            return []
        reasons = {cid: buf.release_reasons.pop(cid, "evicted") for cid in released}
        held = {cid for cid in reasons if cid in self.registry}
        dead = self.registry.release(released)
        for cid in dead:
            if cid in held:  # a chunk never held (restored mid-release) is not recounted
                self.released_by[reasons[cid]] += 1
            self.holders.pop(cid, None)
        return dead

    def ledger(self, acknowledged: int) -> dict:
        """The ledger (see the module docstring) and whether it balances; plus chunk ids
        indexed twice in one buffer (there must be none)."""
        dropped = {k.split("/", 1)[1]: v for k, v in sorted(self.released_by.items())
                   if k.startswith("dropped/")}
        evicted, consumed = self.released_by["evicted"], self.released_by["consumed"]
        in_buffers = len(self.registry)
        duplicates = {}
        for name, buf in self.buffers.items():
            ids = buf.chunk_occurrences()
            duplicates[name] = len(ids) - len(set(ids))
        return {"acknowledged": acknowledged, "in_buffers": in_buffers, "evicted": evicted,
                "consumed": consumed, "dropped": dropped,
                "balanced": acknowledged == in_buffers + evicted + consumed
                + sum(dropped.values()),
                "duplicate_chunks": duplicates}

    def inserts_blocked(self) -> bool:
        """Some receiving buffer's samplers are too far behind: collectors should wait."""
        for name in self.insert_into:
            m = self.buffers[name].monitor
            if self.limiters[name].inserts_blocked(m.usable_items, m.sampled_items):
                return True
        return False

    # -- sampling ---------------------------------------------------------------------------

    def plan(self, req: SampleRequest) -> list[PartPlan]:
        """Which buffers a request draws from, and how many items per batch from each."""
        if req.by_buffer is not None:
            for name in req.by_buffer:
                if name not in self.buffers:
                    raise UnknownBuffer(name, f"by_buffer.{name}")
            return [PartPlan(name, name, n) for name, n in req.by_buffer.items()]
        mix: Sequence[MixShare | MixPart] = req.mix or self.cfg.learner.mix
        for i, share in enumerate(mix):
            if share.buffer not in self.buffers:
                raise UnknownBuffer(share.buffer, f"mix.{i}.buffer")
        # Largest remainder: sizes add up to batch_size exactly.
        raw = [share.fraction * req.batch_size for share in mix]
        sizes = [int(r) for r in raw]
        order = sorted(range(len(raw)), key=lambda i: raw[i] - sizes[i], reverse=True)
        for i in order[: req.batch_size - sum(sizes)]:
            sizes[i] += 1
        return [PartPlan(share.buffer, None, n) for share, n in zip(mix, sizes, strict=True)
                if n > 0]

    def queue_buffer(self, plan: list[PartPlan]) -> str | None:
        """The queue buffer a plan draws whole chunks from, if it does (then it is its only
        part: the config allows no mix with a queue)."""
        for part in plan:
            if isinstance(self.buffers[part.buffer], QueueBuffer):
                return part.buffer
        return None

    def grantable(self, plan: list[PartPlan], num_batches: int) -> int:
        grant = num_batches
        for part in plan:
            buf = self.buffers[part.buffer]
            m = buf.monitor
            if isinstance(buf, QueueBuffer):  # a "batch" is one whole chunk, handed out once
                ready = len(buf.queue) if len(buf) >= self.limiters[part.buffer].min_size else 0
                grant = min(grant, ready)
                continue
            items = part.batch_size * (buf.sequence_length
                                       if isinstance(buf, EpisodeBuffer | SequenceBuffer)
                                       else 1)
            grant = min(grant, self.limiters[part.buffer].grantable_batches(
                items, len(buf), m.usable_items, m.sampled_items))
        return max(0, grant)

    def sample(self, plan: list[PartPlan], num_batches: int, train_iteration: int,
               policy_version: int, worker_id: str | None = None
               ) -> tuple[list[str], list[PartRefs], list[str]]:
        """(chunk ids, one PartRefs per part, chunk ids to delete: queue buffers drop stale
        chunks while handing out). Whole chunks handed out of a queue are remembered as held
        by `worker_id`, so they can be requeued if that learner dies."""
        chunk_ids: list[str] = []
        dead: list[str] = []
        index_of: dict[str, int] = {}
        parts = []
        for part in plan:
            buf = self.buffers[part.buffer]
            refs = buf.sample(part.batch_size, num_batches, train_iteration, policy_version)
            if self.batch_log is not None:
                self.batch_log.on_sample(part.buffer, refs.item_ids, train_iteration)
            if isinstance(buf, QueueBuffer):
                dead += self._settle(buf, buf.take_released())
                if worker_id is not None:
                    self.holders.update(dict.fromkeys(refs.chunk_ids, worker_id))
            if not chunk_ids:
                # The first part's ids (distinct, as every buffer gives them) are the list as
                # it is: renumbering the hundreds of chunks of a many-batch request one by one
                # would be a large share of the sample's time.
                chunk_ids = list(refs.chunk_ids)
                if len(plan) > 1:
                    index_of = {cid: k for k, cid in enumerate(chunk_ids)}
                chunk_index = refs.chunk_index
            else:  # renumber into the response's shared chunk list
                remap = np.empty(len(refs.chunk_ids), dtype=np.int64)
                for j, cid in enumerate(refs.chunk_ids):
                    k = index_of.get(cid)
                    if k is None:
                        k = index_of[cid] = len(chunk_ids)
                        chunk_ids.append(cid)
                    remap[j] = k
                chunk_index = remap[refs.chunk_index] if remap.size else refs.chunk_index
            parts.append(PartRefs(part.buffer, part.key, chunk_index, refs.rows,
                                  refs.item_ids, refs.weights, refs.sequence_length,
                                  refs.lengths))
        return chunk_ids, parts, dead

    # -- feedback from learners ---------------------------------------------------------------

    def update_priorities(self, updates: list[PriorityUpdate]) -> int:
        applied = 0
        for i, u in enumerate(updates):
            buf = self.buffers.get(u.buffer)
            if buf is None:
                raise UnknownBuffer(u.buffer, f"priorities.{i}.buffer")
            applied += buf.update_priorities(np.asarray(u.item_ids, dtype=np.int64),
                                             np.asarray(u.priorities, dtype=np.float64))
        return applied

    def consume(self, consumed: list[Consumed], replaying: bool = False) -> list[str]:
        """Release what learners used up; `replaying`: a journalled consumption, replayed
        into buffers restored from a snapshot (see `QueueBuffer.consume`)."""
        dead: list[str] = []
        for i, c in enumerate(consumed):
            buf = self.buffers.get(c.buffer)
            if buf is None:
                raise UnknownBuffer(c.buffer, f"consumed.{i}.buffer")
            dead += self._settle(buf, buf.consume(c.chunk_ids, queued_too=replaying))
        return dead

    def requeue_held_by(self, worker_id: str) -> int:
        """Give back the queue chunks a learner took and will never consume (it died or
        restarted): they go to the head of their queue, to be handed out again."""
        ids = [cid for cid, holder in self.holders.items() if holder == worker_id]
        if not ids:
            return 0
        n = 0
        for buf in self.buffers.values():
            if isinstance(buf, QueueBuffer):
                n += buf.requeue([cid for cid in ids if cid in buf.in_flight])
        for cid in ids:
            del self.holders[cid]
        return n

    def check_feedback(self, updates: list[PriorityUpdate], consumed: list[Consumed]) -> None:
        """Validate names before anything changes, so a bad learn-info changes nothing."""
        for i, u in enumerate(updates):
            if u.buffer not in self.buffers:
                raise UnknownBuffer(u.buffer, f"priorities.{i}.buffer")
            values = np.asarray(u.priorities, dtype=np.float64)
            if not np.isfinite(values).all() or (values < 0).any():
                raise BadRequest(f"priorities.{i}.priorities: must be finite and >= 0",
                                 f"priorities.{i}.priorities")
        for i, c in enumerate(consumed):
            if c.buffer not in self.buffers:
                raise UnknownBuffer(c.buffer, f"consumed.{i}.buffer")

    # -- clearing and loading (operators' tools) ---------------------------------------------

    def writable(self, name: str) -> Buffer:
        """The named buffer, if it may be cleared or loaded: a dataset buffer's items are its
        dataset (`ReadOnlyBuffer`)."""
        buf = self.buffers.get(name)
        if buf is None:
            raise UnknownBuffer(name, "name")
        if isinstance(buf, DatasetBuffer):
            raise ReadOnlyBuffer(name)
        return buf

    def clear(self, name: str) -> tuple[int, int, list[str]]:
        """Empty a buffer: (items it held, chunks it referred to, chunk ids no buffer refers
        to any more, to delete). The buffer is rebuilt empty from its config, keeping its
        counters and random generator; its chunks leave the ledger as `dropped/cleared` and
        its items count as dropped, so the rate limiter's line drops with them: learners
        wait for fresh items as they do after the run's start, never oversample the few
        new ones."""
        old = self.writable(name)
        items, ids = len(old), sorted(old.chunk_ids())
        priority_eps = (self.cfg.algo.priority_eps
                        if isinstance(self.cfg.algo, PrioritySettings) else 1e-6)
        fresh = make_buffer(name, self.cfg.buffers[name], 0, priority_eps)
        fresh.monitor, fresh.rng = old.monitor, old.rng
        fresh.monitor.dropped["cleared"] += items
        fresh.monitor.released_chunks += len(ids)
        for chunk_id in ids:
            old.release_reasons[chunk_id] = "dropped/cleared"
        self.buffers[name] = fresh
        if self.batch_log is not None:  # the fresh buffer's item ids start again at 0
            self.batch_log.on_clear(name)
        return items, len(ids), self._settle(old, ids)

    def check_load(self, name: str, metas: list[ChunkMeta],
                   priorities: list[list[float]] | None) -> None:
        """Validate a load before anything changes (raises `UnknownBuffer`,
        `ReadOnlyBuffer`, `StaleLoad` or `BadRequest`)."""
        buf = self.writable(name)
        if isinstance(buf, QueueBuffer):
            if buf.max_policy_lag is not None:  # the queue drops them as it hands out
                raise StaleLoad(name, f"buffers.{name}.max_policy_lag", buf.max_policy_lag)
            algo = self.cfg.algo
            if isinstance(algo, RolloutSettings) and algo.max_policy_lag is not None:
                # the learner's rollouts drop them (learner/feed/rollouts.py)
                raise StaleLoad(name, "algo.max_policy_lag", algo.max_policy_lag)
        if priorities is None:
            return
        if len(priorities) != len(metas):
            raise BadRequest(f"priorities: {len(priorities)} lists for {len(metas)} chunks",
                             "priorities")
        for i, (p, m) in enumerate(zip(priorities, metas, strict=True)):
            if len(p) != m.length:
                raise BadRequest(f"priorities.{i}: {len(p)} priorities for a chunk of "
                                 f"{m.length} rows", f"priorities.{i}")
            if any(v < 0 for v in p):
                raise BadRequest(f"priorities.{i}: must be >= 0", f"priorities.{i}")

    def load_into(self, name: str, metas: list[ChunkMeta], train_iteration: int,
                  priorities: list[list[float]] | None = None
                  ) -> tuple[list[ChunkMeta], list[str]]:
        """Index chunks in one buffer only (`rlfleet buffer load`); (the chunks that were
        new, chunk ids to delete). A prioritized buffer's new items get `priorities` where
        given (one per row of each chunk); other kinds ignore them."""
        buf = self.writable(name)
        fresh = self.unseen(metas)
        if not fresh:
            return [], []
        given = ({m.chunk_id: p for m, p in zip(metas, priorities, strict=True)}
                 if priorities is not None else {})
        dead: list[str] = []
        for m in fresh:
            self.registry.hold(m.chunk_id, 1)
            info = ChunkInfo(m.chunk_id, m.length, m.policy_version,
                             tuple((start, n) for start, n in m.segments))
            ring = buf if isinstance(buf, PrioritizedBuffer) else None
            first_uid = ring.next_uid if ring is not None else 0
            dead += self._settle(buf, buf.insert([info], train_iteration))
            prio = given.get(m.chunk_id)
            if prio is not None and ring is not None and ring.next_uid > first_uid:
                # ring items: the chunk's rows in order, the newest `capacity` of them
                n = min(m.length, buf.capacity)
                uids = np.arange(ring.next_uid - n, ring.next_uid, dtype=np.int64)
                ring.update_priorities(uids, np.asarray(prio[m.length - n:], dtype=np.float64))
        return fresh, dead

    # -- snapshots --------------------------------------------------------------------------

    def snapshot(self) -> dict[str, tuple[dict[str, np.ndarray], dict[str, str]]]:
        """Every buffer's index as copied arrays: cheap, taken under the caller's lock."""
        return {name: buf.snapshot() for name, buf in self.buffers.items()}

    @staticmethod
    def write_snapshot(storage: Storage, state: dict, counters: dict, generation: int) -> None:
        """Encode and write a snapshot (outside the lock). Buffer blobs are named by
        generation and the counters' JSON, written last, points at them: a crash midway
        leaves the previous generation whole, never a mix of two."""
        previous = storage.get_blob("snapshot.coordinator")
        names = {}
        for name, (arrays, meta) in state.items():
            names[name] = f"snapshot.buffer.{name}.{generation}"
            storage.put_blob(names[name], encode_arrays(arrays, meta))
        storage.put_blob("snapshot.coordinator", json.dumps(
            {"generation": generation, "counters": counters, "buffers": names}).encode())
        if previous is not None:
            for old in json.loads(previous).get("buffers", {}).values():
                if old not in names.values():
                    storage.delete_blob(old)

    def load(self, storage: Storage) -> dict | None:
        """Restore every buffer from storage; returns the saved counters, or None when there
        is no snapshot."""
        raw = storage.get_blob("snapshot.coordinator")
        if raw is None:
            return None
        state = json.loads(raw)
        self.generation = int(state.get("generation", 0))
        for name, buf in self.buffers.items():
            blob_name = state["buffers"].get(name)
            blob = storage.get_blob(blob_name) if blob_name else None
            if blob is None:
                log.warning("no snapshot for buffer %s: it starts empty", name)
                continue
            arrays, meta = decode_arrays(blob)
            buf.restore(arrays, meta)
        self.registry = ChunkRegistry()
        for buf in self.buffers.values():
            if isinstance(buf, DatasetBuffer):
                continue  # outside the registry: never released, never deleted
            for chunk_id in buf.chunk_ids():
                self.registry.hold(chunk_id, 1)
        self.holders = {}  # restored queues hold their in-flight chunks queued again
        counters = state["counters"]
        self.released_by = Counter(counters.get("ledger", {}))
        return counters

    def stats(self) -> dict[str, dict[str, float | str]]:
        out: dict[str, dict[str, float | str]] = {}
        for name, buf in self.buffers.items():
            buf.monitor.tick()
            out[name] = {"kind": buf.kind, **buf.stats()}
        return out
