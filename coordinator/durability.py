"""Crash safety: the write-ahead journal, snapshots, restore, and the janitor.

A chunk report is appended to the write-ahead journal in storage before it is acknowledged;
a snapshot of generation G holds everything journalled before it, so a restarted coordinator
loads the newest snapshot and replays journals G, G+1, ... Chunks released by buffers are
deleted only after a later snapshot is written, so neither a snapshot nor a journal ever
refers to a deleted chunk.

The *janitor* thread deletes released chunks from storage in batches, off the request path,
and hands chunks that were written but never announced to the `OrphanCollector`
(`garbage.py`). It also writes the periodic snapshots: a storage call can hang for its whole
retry window while storage is unreachable, and the scheduler must go on reaping silent
workers meanwhile.

`Durability` keeps no run state of its own beyond this bookkeeping. It is handed the replay
and the run's `CoordinatorState` (whose lock guards the replay and the counters), the
`SnapshotParts` (`snapshot.py`: what a snapshot holds beside the buffers, as a versioned
model) and the `Intake` (`intake.py`), which a restore replays the journal into as the
request handlers make the same changes live. So this module never imports the coordinator.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from rlfleet.coordinator.garbage import OrphanCollector
from rlfleet.coordinator.intake import Intake
from rlfleet.coordinator.snapshot import CoordinatorSnapshot, SnapshotParts
from rlfleet.coordinator.state import CoordinatorState
from rlfleet.shared.contract.wire.experience import ChunkMeta
from rlfleet.shared.infra.storage import Storage, StorageError
from rlfleet.shared.replay.replay import Replay
from rlfleet.shared.run.config import RunConfig

log = logging.getLogger("rlfleet.coordinator")

_GC = "gc"  # the janitor's cue to look for chunks nobody announced
_SNAPSHOT = "snapshot"  # the janitor's cue to save a snapshot
_FOREVER = 1 << 62

@dataclass(frozen=True)
class Resumed:
    """Where a restore took the run up: the snapshot it read (None: journals alone), and
    the chunks its journals added."""

    generation: int
    journalled_chunks: int
    env_steps: int
    snapshot: CoordinatorSnapshot | None


def _journal_record(worker_id: str, metas: list[ChunkMeta]) -> bytes:
    return json.dumps({"worker_id": worker_id,
                       "chunks": [m.model_dump(mode="json") for m in metas]}).encode()


class Durability:
    """The coordinator's journal, snapshots and janitor."""

    def __init__(self, cfg: RunConfig, storage: Storage, storage_url: str,
                 state: CoordinatorState, replay: Replay, *, snapshots: SnapshotParts,
                 intake: Intake, garbage: OrphanCollector) -> None:
        self.cfg = cfg
        self.storage = storage
        self.storage_url = storage_url
        self.clock = state.clock
        self.replay = replay
        self.state = state
        self.snapshots = snapshots
        self.intake = intake
        self.garbage = garbage
        self._cond = state.cond
        self._delete_q: queue.Queue[list[str] | str | None] = queue.Queue()
        self._janitor = threading.Thread(target=self._janitor_loop, name="janitor", daemon=True)
        self._started = False
        self._last_snapshot = self.clock()
        self._snapshot_cued = False  # a snapshot cue waits for the janitor, or is being run
        self._closing = threading.Event()  # no snapshot may follow the final one
        self._snapshot_lock = threading.Lock()
        self._pending_lock = threading.Lock()
        self._pending_delete: list[str] = []  # released, deleted after the next snapshot
        self.snapshots_saved = 0
        # Orders journal appends against each other and against a snapshot's copy, so a
        # snapshot never misses a chunk that went into an older journal.
        self._journal_lock = threading.Lock()
        self._last_gc = self.clock()

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        if not self._started:
            self._started = True
            self._janitor.start()

    def close(self) -> None:
        """Stop the janitor, then write the final snapshot (deleting what it frees
        directly, since the janitor is gone). Never raises: closing must finish."""
        self._closing.set()
        self._delete_q.put(None)
        if self._started:
            self._janitor.join(timeout=5)
        try:
            self.save_snapshot(final=True)
        except Exception:  # closing must finish; the failure is logged for the operator
            log.exception("final snapshot failed")
        self._delete_left_over()

    def _delete_left_over(self) -> None:
        """Chunks a snapshot freed that the janitor never got to: a periodic snapshot that
        was being written as the close began queues its deletions behind the janitor's stop.
        Every snapshot since is written, so they are deleted here, not left for a later GC
        (which waits `orphan_grace_s`)."""
        ids: list[str] = []
        while True:
            try:
                item = self._delete_q.get_nowait()
            except queue.Empty:
                break
            if item not in (None, _GC, _SNAPSHOT):
                ids.extend(item)
        if not ids:
            return
        try:
            self.storage.delete_chunks(ids)
        except Exception:  # closing must finish; a later GC finds them
            log.exception("deleting %d released chunks at close failed", len(ids))

    def tick(self, now: float) -> None:
        """The scheduler's turn: cues to the janitor, for a snapshot when one is due and for
        GC. Never waits on storage itself."""
        every = self.cfg.coordinator.snapshot_interval_s
        if every is not None and not self._snapshot_cued and now - self._last_snapshot >= every:
            self._snapshot_cued = True
            self._delete_q.put(_SNAPSHOT)
        if now - self._last_gc >= self.cfg.coordinator.gc_interval_s:
            self._last_gc = now
            self._delete_q.put(_GC)

    # -- the journal ------------------------------------------------------------------------

    @contextmanager
    def journalled(self, worker_id: str, metas: list[ChunkMeta]) -> Iterator[list[ChunkMeta]]:
        """Journal a report's new chunks, then yield them with `cond` held, for the caller
        to index before any snapshot can be copied: a chunk is in a journal the snapshot
        replaces, or in the snapshot, never in neither. A `StorageError` from the journal
        leaves the body unrun and nothing changed."""
        with self._journal_lock:
            with self._cond:
                # not held, not released lately, and not deleted as never announced
                fresh = self.garbage.refuse_deleted(self.replay.unseen(metas))
                generation = self.replay.generation
            if fresh:
                self.storage.append_journal(generation, [_journal_record(worker_id, fresh)])
            with self._cond:
                yield fresh

    def journal_event(self, event: dict, change: Callable[[], object]) -> None:
        """Journal a change of run state that is not a chunk (a league snapshot), then make
        it with `cond` held, in journal order with the chunks; a restore replays it through
        `on_event`. A `StorageError` leaves the change unmade."""
        with self._journal_lock:
            with self._cond:
                generation = self.replay.generation
            self.storage.append_journal(generation, [json.dumps({"event": event}).encode()])
            with self._cond:
                change()

    def discard_journals(self) -> None:
        """A fresh run: nothing an older run journalled may be replayed into it."""
        self.storage.delete_journals(_FOREVER)

    # -- snapshots --------------------------------------------------------------------------

    def release(self, dead: list[str]) -> None:
        """Chunks no buffer refers to any more. With snapshots on, they are deleted only once
        a snapshot taken after their release is written: the snapshot a restart restores
        from must never refer to a deleted chunk."""
        if not dead:
            return
        if self.cfg.coordinator.snapshot_interval_s is None:
            self._delete_q.put(dead)
            return
        with self._pending_lock:
            self._pending_delete.extend(dead)

    def save_snapshot(self, final: bool = False) -> None:
        """Buffers' indexes and the run's counters to storage: copied under the lock so they
        describe one moment, encoded and written outside it so requests are not held up.
        Chunks released before the copy are deleted once it is written."""
        with self._snapshot_lock:  # one writer at a time (janitor, shutdown)
            if self._closing.is_set() and not final:
                return
            commander = self.snapshots.commander_state()  # user code: not under the lock
            with self._journal_lock, self._cond:
                buffers, saved = self.replay.snapshot(), self.snapshots.capture(commander)
                self.replay.generation += 1  # later reports go to the next journal
                generation = self.replay.generation
                with self._pending_lock:
                    ready, self._pending_delete = self._pending_delete, []
            try:
                self.replay.write_snapshot(self.storage, buffers, saved.model_dump(mode="json"),
                                           generation)
            except BaseException:
                with self._pending_lock:  # not safe to delete yet: keep them for the next
                    self._pending_delete = ready + self._pending_delete
                raise
            self._last_snapshot = self.clock()
            self.snapshots_saved += 1
            try:  # the snapshot holds everything the older journals did
                self.storage.delete_journals(generation)
            except StorageError as err:
                log.warning("old journals not deleted (the next snapshot will): %s", err)
        if ready:
            if final:  # the janitor has stopped
                self.storage.delete_chunks(ready)
            else:
                self._delete_q.put(ready)

    def restore(self) -> Resumed | None:
        """Continue from storage: the newest snapshot, then every journal from its
        generation on, in order. None (and a fresh run) if there is neither. Raises
        `SnapshotFormatError` for a snapshot this coordinator cannot read."""
        with self._cond:
            counters = self.replay.load(self.storage)
            generations = self.storage.journal_generations()
            if counters is None and not generations:
                log.info("no snapshot in %s: starting a fresh run", self.storage_url)
                return None
            saved = CoordinatorSnapshot.read(counters) if counters is not None else None
            if saved is not None:
                self.snapshots.restore(saved)
            start = self.replay.generation
            replayed = 0
            for generation in generations:
                if generation < start:
                    continue  # already in the snapshot (its deletion was cut short)
                for raw in self.storage.read_journal(generation):
                    record = json.loads(raw)
                    if "event" in record:
                        self.release(self.intake.replay_event(record["event"]))
                        continue
                    metas = [ChunkMeta.model_validate(m) for m in record["chunks"]]
                    fresh, dead = self.intake.accept(metas, record["worker_id"])  # dedups
                    replayed += len(fresh)
                    self.release(dead)
            self.replay.generation = max([start, *generations])
        env_steps = self.state.env_steps
        log.info("restored run at %d env steps (snapshot generation %d, %d chunks from the "
                 "journal), %d items in buffers", env_steps, start, replayed,
                 self.replay.size())
        return Resumed(generation=start, journalled_chunks=replayed, env_steps=env_steps,
                       snapshot=saved)

    # -- the janitor ------------------------------------------------------------------------

    def _janitor_loop(self) -> None:
        while True:
            item = self._delete_q.get()
            if item is None:
                return
            gc, snapshot = item == _GC, item == _SNAPSHOT
            ids: list[str] = [] if gc or snapshot else list(item)
            while True:  # batch whatever else is already waiting
                try:
                    more = self._delete_q.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self._delete_q.put(None)
                    break
                if more == _GC:
                    gc = True
                elif more == _SNAPSHOT:
                    snapshot = True
                else:
                    ids.extend(more)
            if snapshot:
                self._snapshot()
            try:
                if ids:
                    self.storage.delete_chunks(ids)
                if gc:
                    self.collect_garbage()
            except StorageError as err:  # an outage: what is left is found by a later GC
                log.warning("storage clean-up failed (%d ids): %s", len(ids), err)
            except Exception:  # the janitor must survive a bug; logged for the operator
                log.exception("storage clean-up failed")

    def _snapshot(self) -> None:
        try:
            self.save_snapshot()
        except StorageError as err:  # an outage: a later tick cues another
            log.warning("snapshot not saved: %s", err)
            self._last_snapshot = self.clock()
        except Exception:  # the janitor must survive a bug; logged for the operator
            log.exception("snapshot failed")
        finally:
            self._snapshot_cued = False

    def collect_garbage(self) -> list[str]:
        """Delete chunks in storage that no buffer holds, that are not waiting for a
        snapshot before deletion, and that nobody announced for `orphan_grace_s`
        (`OrphanCollector`). Returns the ids deleted."""
        stored = self.storage.list_chunks()
        with self._cond, self._pending_lock:
            orphans = self.garbage.orphans(stored, set(self._pending_delete))
        return self.garbage.collect(orphans)
