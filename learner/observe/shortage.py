"""A data shortage at the learner: how long its training loop has waited for data without a
break, and one warning when that passes `learner.data_shortage_warn_s`.

Waiting for a moment between batches is normal (the `sample_wait_ms` timer measures it); a
learner that has had nothing for a minute is a run that is not training, and its user should
hear it without reading timers: in the learner's log here, and as an alert of the
coordinator's (`coordinator/health.py`), which reads `data_wait_s` from the heartbeats.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

log = logging.getLogger("rlfleet.learner")


class DataShortage:
    def __init__(self, warn_after_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.warn_after_s = warn_after_s
        self.clock = clock
        self._since = clock()  # the last time data arrived (or the loop began waiting)
        self._warned = False
        self.shortages = 0  # warned shortages over the learner's lifetime

    def fed(self) -> None:
        """Data arrived: a warned shortage is over."""
        now = self.clock()
        if self._warned:
            log.info("data arrives again after %.0f s without", now - self._since)
            self._warned = False
        self._since = now

    def waiting(self) -> None:
        """One more wait came back empty: warn once when the shortage passes the limit."""
        waited = self.seconds()
        if not self._warned and waited >= self.warn_after_s:
            self._warned = True
            self.shortages += 1
            log.warning("no data for %.0f s (learner.data_shortage_warn_s=%g): are collectors "
                        "running, and does the buffer's rate limit let the learner sample?",
                        waited, self.warn_after_s)

    def seconds(self) -> float:
        """Seconds since data last arrived."""
        return max(0.0, self.clock() - self._since)
