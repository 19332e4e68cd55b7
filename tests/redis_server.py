"""A `redis-server` of one test's own, for the tests that kill or restart Redis (the suite's
shared Redis on 6379 is never touched): the unit tests' outage tests, the recovery tests and
the chaos suite import it from here (`tests/` is on `sys.path` under pytest's rootdir)."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import redis


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """A `redis-server` process on a fixed port, so a restart keeps the URL.

    Every write is fsynced to its append-only file before the reply (`appendfsync always`),
    so a SIGKILL loses nothing the server acknowledged."""

    def __init__(self, workdir: Path, password: str | None = None) -> None:
        self.workdir = workdir
        self.port = _free_port()
        self.password = password
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self, timeout_s: float = 20.0) -> None:
        assert self.proc is None, "already running"
        self.starts += 1
        with open(self.workdir / f"redis-{self.starts}.log", "wb") as log:
            self.proc = subprocess.Popen(
                ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                 "--save", "", "--appendonly", "yes", "--appendfsync", "always",
                 "--dir", str(self.workdir),
                 *(["--requirepass", self.password] if self.password else [])],
                stdout=log, stderr=subprocess.STDOUT)
        ping = redis.Redis(port=self.port, password=self.password, socket_connect_timeout=0.5)
        deadline = time.monotonic() + timeout_s
        try:
            while not self._answers(ping):
                if time.monotonic() > deadline:
                    raise AssertionError(f"redis-server did not answer PING in {timeout_s}s")
                time.sleep(0.02)
        finally:
            ping.close()

    def _answers(self, client: redis.Redis) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"redis-server exited with {self.proc.returncode}: "
                                 f"{(self.workdir / f'redis-{self.starts}.log').read_text()}")
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False

    def kill(self) -> None:
        """SIGKILL: no shutdown, no final save; only what was fsynced survives."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=10)
        self.proc = None

    def restart(self) -> None:
        if self.proc is not None:
            self.kill()
        self.start()

    def close(self) -> None:
        if self.proc is not None:
            self.kill()
