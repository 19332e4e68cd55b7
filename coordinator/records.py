"""The run's log records as a feed with a cursor, for pages that draw live curves.

A page that polls `/api/v1/records?after=<cursor>` gets only the records written since its
last poll, so a curve costs one small answer per poll however long the run has been going,
instead of the whole metrics.jsonl each time. The feed is one more `MetricWriter` of the run
logger: it sees exactly the cleaned records every other writer sees, in the same order.

The cursor is a sequence number within one coordinator process (`epoch`). After a coordinator
restart the epoch changes and the feed is seeded again from metrics.jsonl (what the resumed
run kept), so a page that sees a new epoch starts over and redraws the same curves.

Memory stays flat however long the run: the newest `capacity` records are kept whole, and of
the older ones each scope keeps an evenly thinned history of at most `history` records whose
stride doubles each time it fills (TensorBoard keeps a reservoir of 1,000 points per tag for
the same reason). A page opened on the seventh day still draws the whole week, at a coarser
resolution for the older part; a reader is told how many records after its cursor are no
longer kept (`missed`).
"""

from __future__ import annotations

import heapq
import json
import secrets
import threading
from bisect import bisect_right
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from itertools import islice
from pathlib import Path
from typing import Any

from rlfleet.shared.telemetry.rundata import read_records

# Records kept whole: each as its JSON text (about 0.6 KB, a third of the dict it came from).
# At the default intervals a CartPole run writes a few hundred a minute, so these reach back
# ten minutes or more; a full feed holds about 3 MB, plus its thinned history.
CAPACITY = 4_000
# Older records kept per scope, thinned evenly: under 1 MB a scope.
HISTORY = 1_000

Record = tuple[int, str, int, float, str]  # (seq, scope, step, wall_time, values as JSON)


def _seq(record: Record) -> int:
    return record[0]


class _Thinned:
    """One scope's records older than the whole-kept window: every `stride`-th of them, the
    stride doubling (every other kept record dropped) whenever `cap` are kept."""

    __slots__ = ("cap", "records", "seen", "stride")

    def __init__(self, cap: int) -> None:
        self.cap, self.stride, self.seen = cap, 1, 0
        self.records: list[Record] = []

    def add(self, record: Record) -> None:
        self.seen += 1
        if self.cap <= 0 or (self.seen - 1) % self.stride:
            return
        self.records.append(record)
        if len(self.records) >= self.cap:
            self.records = self.records[::2]
            self.stride *= 2

    def after(self, seq: int) -> list[Record]:
        return self.records[bisect_right(self.records, seq, key=_seq):]

    def count(self, lo: int, hi: int) -> int:
        """Kept records with lo < seq <= hi."""
        return (bisect_right(self.records, hi, key=_seq)
                - bisect_right(self.records, lo, key=_seq))


class RecordFeed:
    """Thread-safe: the logger writes from request threads while pages read."""

    def __init__(self, capacity: int = CAPACITY, history: int = HISTORY) -> None:
        self.epoch = secrets.token_hex(6)
        self._records: deque[Record] = deque()  # the newest, whole, consecutive seqs
        self._capacity = max(1, capacity)
        self._history_cap = history
        self._history: dict[str, _Thinned] = {}  # scope -> its older records, thinned
        self._seq = 0
        self._lock = threading.Lock()

    # -- MetricWriter -------------------------------------------------------------------------

    def write(self, scope: str, step: int, wall_time: float,
              scalars: Mapping[str, float]) -> None:
        with self._lock:
            self._seq += 1
            self._records.append((self._seq, scope, step, wall_time,
                                  json.dumps(dict(scalars), separators=(",", ":"))))
            if len(self._records) > self._capacity:
                old = self._records.popleft()
                thinned = self._history.get(old[1])
                if thinned is None:
                    thinned = self._history[old[1]] = _Thinned(self._history_cap)
                thinned.add(old)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass  # the records stay readable after the run stops: the page shows the final curves

    # -- reading ------------------------------------------------------------------------------

    def seed(self, jsonl: Path) -> int:
        """Feed the records of an existing metrics.jsonl (a resumed run's kept history)."""
        if not jsonl.exists():
            return 0
        n = 0
        for record in read_records(jsonl):
            values = {k: v for k, v in record.items()
                      if k not in ("scope", "step", "wall_time")}
            self.write(record["scope"], record["step"], float(record.get("wall_time", 0.0)),
                       values)
            n += 1
        return n

    def since(self, after: int, scopes: Iterable[str] | None = None,
              limit: int = 1000) -> dict[str, Any]:
        """Records with a sequence number above `after` (of `scopes`, when given), oldest
        first, at most `limit`: the thinned history, then the whole-kept window. `next` is the
        cursor for the next call: the last record looked at, so records of other scopes are
        not looked at again either. `missed`: records between `after` and `next` that are no
        longer kept."""
        wanted = set(scopes) if scopes else None
        picked: list[Record] = []
        with self._lock:
            latest = self._seq
            cursor = latest
            if after < latest:
                for record in self._candidates(after, wanted):
                    picked.append(record)
                    if len(picked) >= limit:
                        cursor = record[0]
                        break
                missed = (cursor - after) - self._kept(after, cursor)
            else:
                missed = 0
            more = cursor < latest
        out = [{"seq": seq, "scope": scope, "step": step, "wall_time": wall_time,
                "values": json.loads(values)} for seq, scope, step, wall_time, values in picked]
        return {"epoch": self.epoch, "next": cursor, "latest": latest, "missed": missed,
                "more": more, "records": out}

    def _candidates(self, after: int, wanted: set[str] | None) -> Iterator[Record]:
        """Kept records of the wanted scopes after `after`, in order (under the lock)."""
        recent, first = self._records, self._first()
        if after + 1 < first:  # the cursor reaches into the thinned history
            yield from heapq.merge(*(h.after(after) for scope, h in self._history.items()
                                     if wanted is None or scope in wanted), key=_seq)
        # Sequence numbers in the window are consecutive, so the start is found by arithmetic.
        for record in islice(recent, max(0, after + 1 - first), None):
            if wanted is None or record[1] in wanted:
                yield record

    def _kept(self, lo: int, hi: int) -> int:
        """Records of any scope with lo < seq <= hi still kept (under the lock)."""
        first = self._first()
        n = max(0, hi - max(lo, first - 1)) if hi >= first else 0
        if lo + 1 < first:
            n += sum(h.count(lo, min(hi, first - 1)) for h in self._history.values())
        return n

    def _first(self) -> int:
        """The oldest whole-kept sequence number (one past the newest when none is)."""
        return self._records[0][0] if self._records else self._seq + 1

    def kept(self) -> int:
        """How many records are held, whole and thinned: what bounds the feed's memory."""
        with self._lock:
            return len(self._records) + sum(len(h.records) for h in self._history.values())
