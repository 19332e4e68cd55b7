"""Serving a role's Flask app from inside our CLI: one process per role.

The HTTP endpoint is a thread pool in the role's own process (cheroot, CherryPy's production
WSGI server), beside the role's loop. A role keeps its state in memory, so it is one process;
threads serve concurrent requests (a learner's sample request can wait while collectors
report). A second process per role would buy nothing and cost memory: a worker role would
hold torch twice. The process stops on SIGTERM/SIGINT: it stops serving (requests in
flight finish), closes the service (a collector drains, a learner checkpoints, both leave the
coordinator; the coordinator writes its final snapshot) and exits 0; a worker whose loop dies
(`WorkerService.fail`) goes the same way and exits 1, so whatever supervises it (the
launcher, compose, Kubernetes) sees the crash and restarts it.

The app is a plain WSGI app: the pytest client serves the very same one. What cheroot answers
itself, before the app sees a request (a malformed request line, a request line or headers over
64 KiB in all, an HTTP version it does not speak, a timeout), is JSON too, shaped like the app's
errors: see services/http_errors.py.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from rlfleet.shared.contract.config import ConfigError

if TYPE_CHECKING:
    from flask import Flask

log = logging.getLogger("rlfleet.serve")


class InProcessServer:
    """A role's app served by a thread pool of this process, started and stopped around the
    role's service (`app.extensions["rlfleet"]`). `run` blocks until a stop is asked for
    (`request_stop`, SIGTERM or SIGINT once `run` has installed its handlers, or the service's
    `on_fatal`) and returns the process's exit code."""

    def __init__(self, app: Flask, host: str, port: int, threads: int = 4,
                 shutdown_timeout_s: float = 10.0) -> None:
        from cheroot.wsgi import Server  # noqa: PLC0415 - only the worker roles need it

        from rlfleet import http_errors  # noqa: PLC0415 - imports cheroot

        self.app = app
        self.service = app.extensions["rlfleet"]
        # shutdown_timeout: cheroot's stub says int; its thread pool waits any number of seconds
        self.server = Server(
            (host, port), app, numthreads=threads, request_queue_size=64, timeout=30,
            shutdown_timeout=shutdown_timeout_s)  # type: ignore[arg-type]
        # cheroot's own error answers as JSON, and a cap on the request line and headers
        http_errors.install(self.server)
        self._stop = threading.Event()
        self.fatal = False
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        """The port listened on (the one asked for, or the one the OS chose for port 0)."""
        return self.server.bind_addr[1]

    def listen(self) -> InProcessServer:
        """Bind and start answering requests in a thread; a port that cannot be had is a
        `ConfigError` naming it, not a traceback."""
        try:
            self.server.prepare()
        except OSError as err:
            host, port = self.server.bind_addr[:2]
            raise ConfigError(f"cannot listen on {host}:{port}: {err}") from None
        self._thread = threading.Thread(target=self.server.serve, name="http", daemon=True)
        self._thread.start()
        return self

    def wait_stop(self, timeout: float | None = None) -> bool:
        """Whether a stop was asked for, waiting up to `timeout` for one."""
        return self._stop.wait(timeout)

    def request_stop(self, fatal: bool = False) -> None:
        self.fatal = self.fatal or fatal
        self._stop.set()

    def run(self, install_signals: bool = True) -> int:
        """Serve and run the service until asked to stop; then stop serving (requests in
        flight finish), close the service and return 0, or 1 after a fatal error."""
        if install_signals:  # only the main thread may; tests drive `request_stop` instead
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda signum, frame: self._stop.set())
        if self._thread is None:
            self.listen()
        self.service.on_fatal = lambda: self.request_stop(fatal=True)
        try:
            self.service.start()
            while not self._stop.wait(1.0):  # a timed wait lets signal handlers run promptly
                pass
        finally:
            self.server.stop()
            self.service.close()
        if self.fatal:
            log.error("%s stopped after a fatal error", self.app.name)
        return 1 if self.fatal else 0


def serve_in_process(factory: Callable[[], Flask], host: str, port: int,
                     threads: int = 4) -> int:
    """Build the app, serve it from this process and run its service until SIGTERM/SIGINT;
    blocks and returns the exit code."""
    return InProcessServer(factory(), host, port, threads).run()
