"""The coordinator's half of the batch log (`logging.batch_log`, docs/batch-log.md).

Two tables in the run directory, JSONL, each within `max_mb` (rotated like the episode
table, `shared/telemetry/rotating.py`), read back as DataFrames by `load_run`:

- `samples.jsonl`, the unique-samples table: how many times each replay item was handed to
  a learner, and the first and last train iteration it was. Every sample the coordinator
  hands out is counted here, so the table is complete without the learners sending a single
  id. Handing out only queues the request's item ids (under the coordinator's lock, it must
  cost nothing); the scheduler's tick counts them, outside the lock. Counts live in a fixed
  table per buffer (item `uid` in slot `uid % unique_in_memory`, numpy, a few vectorised
  operations per sample request) and go to disk every `flush_s`, when an item is pushed out
  of its slot by a newer one, and when the run ends. An item may so have several rows (one
  per flush it was sampled in); the reader adds them up. A crash loses at most the counts
  since the last flush: they are telemetry, not data anyone acknowledged.
- `batch_log.jsonl`: per-sample values logged during learning, the rows the learners report
  (learner/observe/batch_log.py), stamped with the run's env step and the reporting worker.

Item ids are the buffer's own (`uid`s, ever increasing). Clearing a buffer starts them again
at 0, so each row also carries `buffer_clears`, how many times its buffer had been cleared:
(buffer, buffer_clears, item_id) names one item for the whole run.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

import numpy as np

from rlfleet.shared.contract.config import BatchLogConfig
from rlfleet.shared.contract.wire.sampling import LearnInfo
from rlfleet.shared.telemetry.rotating import MB, SharedTable
from rlfleet.shared.telemetry.rundata import BATCH_LOG_NAME, SAMPLES_NAME

log = logging.getLogger("rlfleet.coordinator")

LINE_ITEMS = 65_536  # items per samples.jsonl line: a reader never parses a huge line
BACKLOG = 4  # queued items past this many tables' worth are counted at once


class _Counts:
    """One buffer's sample counts since its last flush: item `uid` in slot `uid % size`."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.uid = np.full(size, -1, dtype=np.int64)
        self.times = np.zeros(size, dtype=np.int64)  # 0: the slot holds nothing unflushed
        self.first = np.zeros(size, dtype=np.int64)
        self.last = np.zeros(size, dtype=np.int64)

    def add(self, ids: np.ndarray, iteration: int) -> list[np.ndarray] | None:
        """Count one sample of each of `ids` (repeats count as often as they appear);
        returns the rows pushed out of their slots (uid, times, first, last), or None."""
        ids = ids.reshape(-1)
        uniq, counts = np.unique(ids[ids >= 0], return_counts=True)
        pushed: list[list[np.ndarray]] = []
        while uniq.size:
            slots = uniq % self.size
            # two items of one request in one slot: the first now, the others next round
            _, first_of = np.unique(slots, return_index=True)
            if first_of.size < uniq.size:
                now = np.zeros(uniq.size, dtype=bool)
                now[first_of] = True
                rest = (uniq[~now], counts[~now])
                uniq, counts, slots = uniq[now], counts[now], slots[now]
            else:
                rest = None
            held = self.uid[slots]
            live = self.times[slots] > 0
            out = live & (held != uniq)
            if out.any():
                s = slots[out]
                pushed.append([held[out], self.times[s], self.first[s], self.last[s]])
            fresh = ~live | (held != uniq)
            s = slots[fresh]
            self.uid[s] = uniq[fresh]
            self.times[s] = 0
            self.first[s] = iteration
            self.times[slots] += counts
            self.last[slots] = iteration
            if rest is None:
                break
            uniq, counts = rest
        if not pushed:
            return None
        return [np.concatenate(cols) for cols in zip(*pushed, strict=True)]

    def take(self) -> list[np.ndarray]:
        """Every unflushed row (uid, times, first, last), now flushed."""
        s = np.flatnonzero(self.times)
        rows = [self.uid[s], self.times[s].copy(), self.first[s], self.last[s]]
        self.times[s] = 0
        return rows


class BatchLog:
    """Both tables of one run; `run_dir` None (or no `logging.batch_log`): nothing kept."""

    def __init__(self, cfg: BatchLogConfig | None, run_dir: Path | None) -> None:
        self.cfg = cfg
        self.active = cfg is not None and run_dir is not None
        if cfg is not None and run_dir is None:
            log.warning("logging.batch_log is set, but this coordinator has no run directory "
                        "(--run-dir): no batch log is written")
        self._counts: dict[str, _Counts] = {}
        self._clears: dict[str, int] = {}
        self._pushed: list[tuple[str, int, list[np.ndarray]]] = []
        self._pushed_rows = 0
        # sample requests waiting to be counted: (buffer, item ids or None for a clear,
        # train iteration), and how many items they hold
        self._queued: list[tuple[str, np.ndarray | None, int]] = []
        self._queued_items = 0
        self._backlog = BACKLOG * (cfg.unique_in_memory if cfg is not None else 0)
        self._queue_lock = threading.Lock()
        self._count_lock = threading.RLock()  # the tables: counting, clearing, taking
        self._last_flush = time.monotonic()
        self._tables: tuple[SharedTable, SharedTable] | None = None  # samples, values
        if self.active:
            assert cfg is not None and run_dir is not None
            run_dir.mkdir(parents=True, exist_ok=True)
            limit = None if cfg.max_mb is None else max(1, int(cfg.max_mb * MB))
            self._tables = (SharedTable(run_dir / SAMPLES_NAME, limit, "samples"),
                            SharedTable(run_dir / BATCH_LOG_NAME, limit, "batch log"))

    # -- under the coordinator's lock (Replay.sample, Replay.clear): O(1) --------------------

    def on_sample(self, buffer: str, item_ids: np.ndarray, train_iteration: int) -> None:
        """Queue a sample request's items of `buffer` for counting. The counting itself
        (hundreds of microseconds a request) happens outside the coordinator's lock, on its
        scheduler's next tick (`count_queued`); only a backlog past `BACKLOG` tables' worth
        of items is counted here, so the queue's memory stays bounded."""
        if not self.active:
            return
        with self._queue_lock:
            self._queued.append((buffer, item_ids, train_iteration))
            self._queued_items += int(item_ids.size)
            backlog = self._queued_items > self._backlog
        if backlog:
            self.count_queued()

    def on_clear(self, buffer: str) -> None:
        """`buffer` was cleared: its item ids start again at 0, as a new generation (in
        order with the samples queued before and after it)."""
        if self.active:
            with self._queue_lock:
                self._queued.append((buffer, None, 0))

    # -- outside it ----------------------------------------------------------------------------

    def count_queued(self) -> None:
        """Count the queued sample requests' items, in the order they were handed out."""
        if not self.active:
            return
        assert self.cfg is not None
        with self._count_lock:
            with self._queue_lock:
                queued, self._queued, self._queued_items = self._queued, [], 0
            for buffer, ids, iteration in queued:
                clears = self._clears.get(buffer, 0)
                if ids is None:  # a clear
                    counts = self._counts.pop(buffer, None)
                    if counts is not None:
                        self._pushed.append((buffer, clears, counts.take()))
                    self._clears[buffer] = clears + 1
                    continue
                counts = self._counts.get(buffer)
                if counts is None:
                    counts = self._counts[buffer] = _Counts(self.cfg.unique_in_memory)
                pushed = counts.add(np.asarray(ids, dtype=np.int64), iteration)
                if pushed is not None:
                    self._pushed.append((buffer, clears, pushed))
                    self._pushed_rows += int(pushed[0].size)

    def flush_due(self, now: float) -> bool:
        """`flush_s` has passed, or as many rows were pushed out as a table holds."""
        return self.active and self.cfg is not None and (
            now - self._last_flush >= self.cfg.flush_s
            or self._pushed_rows >= self.cfg.unique_in_memory)

    def take_rows(self) -> list[tuple[str, int, list[np.ndarray]]]:
        """What a flush writes: the pushed-out rows and every table's unflushed ones, once
        whatever was queued is counted."""
        with self._count_lock:
            self.count_queued()
            rows, self._pushed, self._pushed_rows = self._pushed, [], 0
            for buffer, counts in self._counts.items():
                rows.append((buffer, self._clears.get(buffer, 0), counts.take()))
            self._last_flush = time.monotonic()
        return rows

    def write_samples(self, rows: list[tuple[str, int, list[np.ndarray]]]) -> None:
        """Write what `take_rows` took."""
        lines = []
        wall = time.time()
        for buffer, clears, (uid, times, first, last) in rows:
            for start in range(0, int(uid.size), LINE_ITEMS):
                cut = slice(start, start + LINE_ITEMS)
                lines.append(json.dumps({
                    "buffer": buffer, "buffer_clears": clears, "wall_time": wall,
                    "item_id": uid[cut].tolist(), "times_sampled": times[cut].tolist(),
                    "first_iteration": first[cut].tolist(),
                    "last_iteration": last[cut].tolist()}) + "\n")
        if lines and self._tables is not None:
            self._tables[0].write("".join(lines))

    def on_learn_info(self, req: LearnInfo, env_steps: int) -> None:
        """The per-sample values a learner reported, one line per logged update and buffer."""
        if self._tables is None or not req.batch_log:
            return
        wall = time.time()
        text = "".join(json.dumps({
            "worker_id": req.worker_id, "train_iteration": e.train_iteration,
            "env_step": env_steps, "wall_time": wall, "buffer": e.buffer,
            "buffer_clears": self._clears.get(e.buffer, 0), "item_id": e.item_ids,
            "values": e.values}) + "\n" for e in req.batch_log)
        self._tables[1].write(text)

    def close(self) -> None:
        for table in self._tables or ():
            table.close()
