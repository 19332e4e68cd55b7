"""Serving a role's Flask app with gunicorn (`-k gthread -w 1`) from inside our CLI.

The app is built in the worker process (never before the fork, so its threads are the
worker's), its background work starts in `post_worker_init` and stops in `worker_exit`.
One worker process because each role keeps its state in memory; threads serve concurrent
requests (a learner's sample request can wait while collectors report).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any

from flask import Flask
from gunicorn.app.base import BaseApplication


class _Gunicorn(BaseApplication):
    def __init__(self, factory: Callable[[], Flask], options: dict[str, Any]) -> None:
        self.factory = factory
        self.options = options
        super().__init__()

    def load_config(self) -> None:
        for key, value in self.options.items():
            self.cfg.set(key, value)

    def load(self) -> Flask:
        return self.factory()


def _start(worker) -> None:
    service = worker.wsgi.extensions["rlfleet"]
    # A role whose loop dies takes the server down with it (the master is our parent).
    service.on_fatal = lambda: os.kill(worker.ppid, signal.SIGTERM)
    service.start()


def _stop(server, worker) -> None:
    app = getattr(worker, "wsgi", None)
    if app is not None:
        app.extensions["rlfleet"].close()


def serve(factory: Callable[[], Flask], host: str, port: int, threads: int = 8,
          log_level: str = "warning") -> None:
    """Run until SIGTERM/SIGINT; blocks."""
    options = {
        "bind": f"{host}:{port}",
        "workers": 1,
        "worker_class": "gthread",
        "threads": threads,
        "timeout": 120,
        "graceful_timeout": 20,
        "keepalive": 30,
        "loglevel": log_level,
        "accesslog": None,
        "post_worker_init": _start,
        "worker_exit": _stop,
    }
    _Gunicorn(factory, options).run()
