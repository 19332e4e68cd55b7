"""How a long command is asked to stop: by a signal (Ctrl-C, SIGTERM, a closed terminal) or,
when the Python API started it (`rlfleet.api`), by its lifeline closing. `rlfleet up` and
`rlfleet single` both stop in order when asked, rather than where a signal caught them.
"""

from __future__ import annotations

import os
import select
import signal
from typing import Any

# The read end of the Python API's lifeline pipe, in the command it started.
LIFELINE_ENV = "RLFLEET_LIFELINE_FD"


class StopSignals:
    """SIGINT, SIGTERM and SIGHUP (a closed terminal) ask the run to stop: while installed,
    each only sets `received`, which the watch loop reads, so the children are stopped in
    order rather than the launcher interrupted wherever it was. `restore` puts back the
    handlers there were; it runs before the stop sequence starts.

    A launcher started by the Python API (`rlfleet.api`) also has a lifeline: the read end of
    a pipe whose write end only the starting process holds. Its end of file (the `Run` was
    dropped, or that process ended, however it ended) asks for the same stop."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self, lifeline: int | None = None) -> None:
        self._signalled = False
        self.lifeline = lifeline
        self._before: dict[int, Any] = {}  # signal -> the handler it had

    @classmethod
    def from_environment(cls) -> StopSignals:
        """With the lifeline the Python API passed (`RLFLEET_LIFELINE_FD`), taken out of the
        environment the children inherit."""
        fd = os.environ.pop(LIFELINE_ENV, None)
        try:
            lifeline = int(fd) if fd is not None else None
            if lifeline is not None:
                os.fstat(lifeline)  # still open in this process
        except (ValueError, OSError):
            lifeline = None
        return cls(lifeline)

    @property
    def received(self) -> bool:
        return self._signalled or self._lifeline_cut()

    def _lifeline_cut(self) -> bool:
        if self.lifeline is None:
            return False
        readable, _, _ = select.select([self.lifeline], [], [], 0)
        # the starting process never writes: readable means end of file
        return bool(readable) and not os.read(self.lifeline, 1)

    def _on_signal(self, signum, frame) -> None:
        self._signalled = True

    def install(self) -> StopSignals:
        for sig in self.SIGNALS:
            self._before[sig] = signal.signal(sig, self._on_signal)
        return self

    def restore(self) -> None:
        for sig, handler in self._before.items():
            signal.signal(sig, handler)
        self._before.clear()
