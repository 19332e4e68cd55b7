"""Shared-memory regions between the learner and its data process: files in /dev/shm (or the
temp directory where there is none) that both map."""

from __future__ import annotations

import mmap
import os
import tempfile
from pathlib import Path

SHM_DIR = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())


def new_region(path: Path, size: int) -> mmap.mmap:
    """Create (or truncate) `path` with `size` bytes, readable by this user only, and map
    it; the file stays named until the other side has mapped it too."""
    fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o600)
    try:
        os.ftruncate(fd, size)
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)
