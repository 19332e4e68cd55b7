"""A JSONL table kept under a size limit: `<stem>.jsonl` rotates into time-named parts.

A run of fast envs writes an episode table of about 170 MB an hour; left for a week it fills
the disk. With a limit, the current file is renamed to `<stem>-<UTC time>.jsonl` (a *part*)
once it passes 1/`PARTS` of the limit, and the oldest parts are deleted while the parts
together pass the rest of it: the table's files never hold much more than the limit (one
batch of rows at most), and what goes first is the oldest rows. Part names sort as their
times do, so `table_files` lists a table oldest first. Every write is flushed to the OS at
once, so a killed writer loses no row it wrote.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import BinaryIO

log = logging.getLogger("rlfleet.rotating")

MB = 1_000_000  # a limit's unit: bytes on disk
PARTS = 8  # the current file rotates at 1/PARTS of the limit: at most that much goes at once
_TIME = "%Y%m%dT%H%M%S.%fZ"


def _part_pattern(stem: str) -> re.Pattern[str]:
    return re.compile(re.escape(stem) + r"-(\d{8}T\d{6}\.\d{6}Z)\.jsonl")


def table_files(directory: Path, name: str) -> list[Path]:
    """Table `name`'s files in `directory`, oldest first: its parts in time order, then the
    current file (where there is one)."""
    stem = Path(name).stem
    pattern = _part_pattern(stem)
    parts = sorted(p for p in directory.glob(f"{stem}-*.jsonl") if pattern.fullmatch(p.name))
    current = directory / name
    return parts + ([current] if current.is_file() else [])


class RotatingJsonl:
    """Appends to `path` and keeps it, with its parts, within `max_bytes` (None: no limit,
    one file that only grows). Not thread-safe: its one writer holds its own lock."""

    def __init__(self, path: Path, max_bytes: int | None) -> None:
        if max_bytes is not None and max_bytes < 1:
            raise ValueError(f"max_bytes={max_bytes}: expected a positive size or None")
        self.path = path
        self.max_bytes = max_bytes
        self._part_bytes = None if max_bytes is None else max(1, max_bytes // PARTS)
        self._pattern = _part_pattern(path.stem)
        self._parts = [(p, p.stat().st_size) for p in table_files(path.parent, path.name)
                       if p != path]
        # table_files lists only names the pattern matches
        last = self._pattern.fullmatch(self._parts[-1][0].name) if self._parts else None
        self._last = (datetime.strptime(last.group(1), _TIME).replace(tzinfo=UTC)
                      if last is not None else None)
        self._file: BinaryIO = path.open("ab")
        self._size = os.fstat(self._file.fileno()).st_size
        self._rotates = max_bytes is not None

    @property
    def closed(self) -> bool:
        return self._file.closed

    @property
    def parts(self) -> list[Path]:
        """The rotated parts still on disk, oldest first."""
        return [p for p, _ in self._parts]

    def write(self, text: str) -> None:
        """Append `text` (whole lines) and flush; then rotate once the file has passed its
        share of the limit. OSError: the text could not be written."""
        data = text.encode("utf-8")
        self._file.write(data)
        self._file.flush()
        self._size += len(data)
        if self._rotates and self._size >= (self._part_bytes or 0):
            self._rotate()

    def close(self) -> None:
        self._file.close()

    def _next_name(self) -> Path:
        """A part name later than every other: two rotations within one microsecond, or a
        clock set back, still sort in the order they happened."""
        now = datetime.now(UTC)
        if self._last is not None and now <= self._last:
            now = self._last + timedelta(microseconds=1)
        self._last = now
        return self.path.with_name(f"{self.path.stem}-{now.strftime(_TIME)}.jsonl")

    def _rotate(self) -> None:
        part = self._next_name()
        self._file.close()
        try:
            self.path.rename(part)
        except OSError as err:  # the table goes on in one file rather than losing rows
            self._rotates = False
            log.warning("%s: cannot rotate (%s); it grows past its limit from now on",
                        self.path, err)
        else:
            self._parts.append((part, self._size))
            self._size = 0
        self._file = self.path.open("ab")
        self._prune()

    def _prune(self) -> None:
        """Delete the oldest parts while they hold more than the limit less one part's
        share: with the current file under its share, the table stays within the limit."""
        assert self.max_bytes is not None and self._part_bytes is not None
        keep = self.max_bytes - self._part_bytes
        total = sum(size for _, size in self._parts)
        while self._parts and total > keep:
            part, size = self._parts.pop(0)
            total -= size
            try:
                part.unlink(missing_ok=True)
            except OSError as err:
                log.warning("%s: cannot delete an old part (%s)", part, err)


class SharedTable:
    """A `RotatingJsonl` that request threads write whole lines to, under one lock. A write
    that fails (a full disk) or comes after `close` is logged and dropped, never raised:
    these tables are telemetry, and must not fail the report or request that fed them."""

    def __init__(self, path: Path, max_bytes: int | None, what: str) -> None:
        self.what = what  # for the warning: "episode table", "batch log", ...
        self._lock = threading.Lock()
        self._file = RotatingJsonl(path, max_bytes)

    def write(self, text: str) -> bool:
        """Append `text` (whole lines); whether it was written."""
        with self._lock:
            if self._file.closed:
                return False
            try:
                self._file.write(text)
            except OSError as err:
                log.warning("%s: rows not written: %s", self.what, err)
                return False
        return True

    def close(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.close()
