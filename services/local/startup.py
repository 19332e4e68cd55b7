"""Where a run's start-up time goes, each figure in seconds from the launch of `rlfleet up`
(the launcher's own process start, so the interpreter's start and the imports count):
`summary.json`'s `startup_s` and `first_chunk_s_from_launch`."""

from __future__ import annotations

import os
import time


def process_age_s() -> float:
    """Seconds since this process started (Linux: its start time in /proc, against the same
    boot clock), so a start-up figure includes the interpreter's start and our imports; 0.0
    where that cannot be read."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0
    return max(0.0, age)


class FirstChunk:
    """When the coordinator accepted its first chunk, in seconds from the launch of `rlfleet
    up` (`summary.json`: `first_chunk_s_from_launch`). The coordinator says it on its own
    clock (`run.first_chunk_s` from its start, beside `run.wall_seconds`); their difference is
    how long ago that was when it answered, which places it on ours (within the half of one
    status request's round trip). Observed from a coordinator that has not restarted."""

    def __init__(self, launched: float) -> None:
        self.launched = launched
        self.seconds: float | None = None

    def observe(self, status: dict, asked: float, answered: float) -> None:
        run = status.get("run", {})
        if (self.seconds is not None or run.get("first_chunk_s") is None
                or run.get("state") == "stopped"):  # a stopped run's wall clock stands still
            return
        ago = float(run["wall_seconds"]) - float(run["first_chunk_s"])
        self.seconds = max(0.0, (asked + answered) / 2 - ago - self.launched)


class Startup:
    """The moments a start passes (`mark`), and the first chunk where the run is new: a
    resumed run's first chunk is no start-up figure."""

    def __init__(self, first_chunk: bool = True) -> None:
        self.launched = time.monotonic() - process_age_s()  # this process's start, our clock
        self.marks: dict[str, float] = {}
        self.first_chunk = FirstChunk(self.launched) if first_chunk else None

    def mark(self, name: str) -> None:
        self.marks[name] = time.monotonic() - self.launched

    def first_chunk_s(self) -> float | None:
        """`first_chunk_s_from_launch`: None where no first chunk was seen (or looked for)."""
        if self.first_chunk is None or self.first_chunk.seconds is None:
            return None
        return round(self.first_chunk.seconds, 3)

    def figures(self) -> dict[str, float]:
        """`startup_s`: every mark, then the first chunk where one was seen."""
        marks = dict(self.marks)
        first = self.first_chunk_s()
        if first is not None:
            marks["first_chunk"] = first
        return {k: round(v, 3) for k, v in marks.items()}
