"""What a chaos test reaches into a running `rlfleet up` with: its processes by role, its
coordinator's API, and a monitor that checks the ledger on every status answer."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path

import requests
from integration.helpers import Up, proc_cmdline, role_of, wait_for

API = "/api/v1"


# -- the run under test ----------------------------------------------------------------------

class Run:
    """`rlfleet up` plus what the test needs to reach into it: its processes by role, and
    its coordinator's HTTP API."""

    def __init__(self, up: Up, run_dir: Path) -> None:
        self.up = up
        self.run_dir = run_dir
        self.http = requests.Session()
        self._url: str | None = None

    def pids(self, role: str, worker_id: str | None = None) -> list[int]:
        """The role's processes: every process of the run whose command line runs the role
        (one per worker: each role is one process)."""
        out = []
        for pid in self.up.descendants():
            cmd = proc_cmdline(pid) + " "
            if role_of(pid) != role:
                continue
            if worker_id is not None and f"--worker-id {worker_id} " not in cmd:
                continue
            out.append(pid)
        return out

    @property
    def url(self) -> str:
        if self._url is None:
            def find() -> str | None:
                for pid in self.pids("coordinator"):
                    args = proc_cmdline(pid).split()
                    return f"http://127.0.0.1:{args[args.index('--port') + 1]}"
                return None
            self._url = wait_for(find, 60, "the coordinator process")
        return self._url

    def status(self) -> dict:
        r = self.http.get(f"{self.url}{API}/status", timeout=3)
        r.raise_for_status()
        return r.json()

    def get(self, path: str) -> dict:
        r = self.http.get(f"{self.url}{API}{path}", timeout=3)
        r.raise_for_status()
        return r.json()

    def kill(self, role: str, worker_id: str | None = None) -> list[int]:
        """SIGKILL every process of the role at once: a crash, not a shutdown (SIGTERM would
        let it close cleanly)."""
        pids = self.pids(role, worker_id)
        assert pids, f"no {role} {worker_id or ''} process to kill"
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return pids

    def ended(self) -> bool:
        return self.up.proc.poll() is not None

    def worker(self, status: dict, worker_id: str) -> dict | None:
        return next((w for w in status["workers"] if w["worker_id"] == worker_id), None)


@dataclass
class Monitor:
    """Polls /status all along: every answer must show a balanced ledger and no chunk
    indexed twice; the buffer's chunk list is checked for repeats now and then."""

    run: Run
    violations: list[str] = field(default_factory=list)
    answers: int = 0
    chunk_checks: int = 0
    acknowledged: int = 0  # the highest ever seen: it must never go down
    stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> Monitor:
        threading.Thread(target=self._loop, daemon=True, name="chaos-monitor").start()
        return self

    def _loop(self) -> None:
        n = 0
        while not self.stop.wait(0.2):
            try:
                s = self.run.status()
            except (requests.RequestException, ValueError):
                continue  # the coordinator is down: that is the point
            self.answers += 1
            self.check(s)
            n += 1
            if n % 10 == 1:  # the first answer, then every tenth
                self.check_chunks()

    def check(self, s: dict) -> None:
        ledger = s["ledger"]
        if not ledger["balanced"]:
            self.violations.append(f"unbalanced ledger: {ledger}")
        if any(ledger["duplicate_chunks"].values()):
            self.violations.append(f"chunk indexed twice: {ledger['duplicate_chunks']}")
        if ledger["acknowledged"] < self.acknowledged:
            self.violations.append(f"acknowledged went down from {self.acknowledged}: "
                                   f"{ledger}")
        self.acknowledged = max(self.acknowledged, ledger["acknowledged"])

    def check_chunks(self) -> None:
        try:
            names = list(self.run.get("/buffers")["buffers"])
            listed = {name: self.run.get(f"/buffers/{name}/chunks")["chunk_ids"]
                      for name in names}
        except (requests.RequestException, ValueError):
            return
        self.chunk_checks += 1
        for name, ids in listed.items():
            if len(ids) != len(set(ids)):
                self.violations.append(f"{len(ids) - len(set(ids))} chunk ids twice in "
                                       f"{name}")


