"""Sending learn-info from a thread of its own, so the update loop never waits on the
coordinator.

Ten reports a second, each a round trip and a JSON body (with a prioritized buffer, thousands
of new priorities), would take from an off-policy learner's updates if it sent them itself.
The training thread only snapshots what a report carries and hands it over; at most one
report is in flight, and the next is due `interval` after the last one ended (a distant
coordinator must not turn every update into a report). What the coordinator answers (the run
is over, the best policy version) is kept for the training thread to act on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from rlfleet.shared.contract.wire.base import API
from rlfleet.shared.contract.wire.sampling import LearnInfo, LearnInfoResponse
from rlfleet.shared.infra.http import HttpClient, HttpError

log = logging.getLogger("rlfleet.learner")


class Reporter:
    """`stop_run` is set when an answer says the run is over (the training's `run_over`);
    the best-evaluated version an answer names waits in `best_policy_version` for the
    training thread, which owns the checkpoints."""

    def __init__(self, client: HttpClient, stop_run: threading.Event | None = None) -> None:
        self.client = client
        self.stop_run = stop_run if stop_run is not None else threading.Event()
        self.best_policy_version: int | None = None
        self.sent = 0
        self.failed = 0
        self._cond = threading.Condition()
        self._pending: Callable[[], LearnInfo] | None = None
        self._in_flight = False
        self._last_end = 0.0
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="report", daemon=True)
        self._thread.start()

    def due(self, interval_s: float) -> bool:
        """Nothing pending or in flight, and `interval_s` since the last report ended."""
        return (self._pending is None and not self._in_flight
                and time.monotonic() - self._last_end >= interval_s)

    def send(self, build: Callable[[], LearnInfo]) -> None:
        """Hand over a report; `build` runs on this reporter's thread, so it must only read
        snapshots (copies the training thread will not change)."""
        with self._cond:
            self._pending = build
            self._cond.notify_all()

    def flush(self, timeout_s: float = 15.0) -> None:
        """Wait until the handed-over report has been sent (or has failed)."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while (self._pending is not None or self._in_flight) and \
                    time.monotonic() < deadline:
                self._cond.wait(0.1)

    def close(self) -> None:
        self.flush()
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._pending is None:
                    if self._stopped:
                        return
                    self._cond.wait(0.5)
                build, self._pending = self._pending, None
                self._in_flight = True
            try:
                self._post(build())
            except Exception:  # a bad report must not end reporting
                self.failed += 1
                log.exception("learn-info report could not be built or sent")
            finally:
                with self._cond:
                    self._in_flight = False
                    self._last_end = time.monotonic()
                    self._cond.notify_all()

    def _post(self, info: LearnInfo) -> None:
        try:
            resp = self.client.post(f"{API}/learn-info", info, LearnInfoResponse)
        except HttpError as err:
            # Priorities are soft state: a lost update only leaves older priorities in place.
            self.failed += 1
            log.warning("learn-info not delivered: %s", err)
            return
        self.sent += 1
        if resp.best_policy_version is not None:
            self.best_policy_version = resp.best_policy_version
        if resp.stop:
            self.stop_run.set()
