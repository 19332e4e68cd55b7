"""The run's log records as a feed with a cursor, for pages that draw live curves.

A page that polls `/api/v1/records?after=<cursor>` gets only the records written since its
last poll, so a curve costs one small answer per poll however long the run has been going,
instead of the whole metrics.jsonl each time. The feed is one more `MetricWriter` of the run
logger: it sees exactly the cleaned records every other writer sees, in the same order.

The cursor is a sequence number within one coordinator process (`epoch`). After a coordinator
restart the epoch changes and the feed is seeded again from metrics.jsonl (what the resumed
run kept), so a page that sees a new epoch starts over and redraws the same curves. The feed
keeps the last `capacity` records: a page that falls further behind is told how many it
missed (`missed`) instead of the coordinator's memory growing with the run.
"""

from __future__ import annotations

import json
import secrets
import threading
from collections import deque
from collections.abc import Iterable, Mapping
from itertools import islice
from pathlib import Path
from typing import Any

from shared.rundata import read_records

# Records kept: at the default intervals a CartPole run writes a few hundred a minute, so the
# newest 20,000 reach back an hour or more; each is kept as its JSON text (about 0.6 KB, a
# third of the dict it came from), so a full feed holds about 15 MB whatever the run's length.
CAPACITY = 20_000


class RecordFeed:
    """Thread-safe: the logger writes from request threads while pages read."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        self.epoch = secrets.token_hex(6)
        # (seq, scope, step, wall_time, the values as JSON text)
        self._records: deque[tuple[int, str, int, float, str]] = deque(maxlen=capacity)
        self._seq = 0
        self._lock = threading.Lock()

    # -- MetricWriter -------------------------------------------------------------------------

    def write(self, scope: str, step: int, wall_time: float,
              scalars: Mapping[str, float]) -> None:
        with self._lock:
            self._seq += 1
            self._records.append((self._seq, scope, step, wall_time,
                                  json.dumps(dict(scalars), separators=(",", ":"))))

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
        first, at most `limit`. `next` is the cursor for the next call: the last record
        looked at, so records of other scopes are not looked at again either."""
        wanted = set(scopes) if scopes else None
        with self._lock:
            first = self._records[0][0] if self._records else self._seq + 1
            missed = max(0, first - after - 1) if after < self._seq else 0
            # Sequence numbers are consecutive, so the start is found by arithmetic.
            start = max(0, after + 1 - first)
            picked: list[tuple[int, str, int, float, str]] = []
            cursor = max(after, first - 1) if after < self._seq else self._seq
            for record in islice(self._records, start, None):
                cursor = record[0]
                if wanted is None or record[1] in wanted:
                    picked.append(record)
                    if len(picked) >= limit:
                        break
            more, latest = cursor < self._seq, self._seq
        out = [{"seq": seq, "scope": scope, "step": step, "wall_time": wall_time,
                "values": json.loads(values)} for seq, scope, step, wall_time, values in picked]
        return {"epoch": self.epoch, "next": cursor, "latest": latest, "missed": missed,
                "more": more, "records": out}
