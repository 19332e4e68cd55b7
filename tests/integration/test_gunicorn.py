"""The coordinator under real gunicorn, as an operator starts it: `gunicorn -c
python:rlfleet.gunicorn_conf 'rlfleet.wsgi:coordinator_app()'` with the `RLFLEET_*` settings,
on loopback, with a storage directory. It answers as `rlfleet coordinator` does (the token
guard, the API), SIGTERM ends it as it ends the in-process server (exit 0, the final snapshot
in storage), `RLFLEET_RESUME=1` restores the run, and a worker that dies while serving ends
gunicorn with exit 1 instead of being replaced by a coordinator with nothing in memory."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import requests
import yaml
from unit.helpers import TaskSink, make_config, write_chunk

from .helpers import free_port, wait_for

COMMAND = [sys.executable, "-m", "gunicorn", "-c", "python:rlfleet.gunicorn_conf",
           "rlfleet.wsgi:coordinator_app()"]
SNAPSHOT = Path("blobs") / "snapshot.coordinator"


class Gunicorn:
    """One gunicorn serving the coordinator; its stdout (the access log) and stderr (its log
    and the coordinator's) in files. `storage_dir` as `unit.helpers.write_chunk` reads it."""

    def __init__(self, tmp_path: Path, token: str, port: int, resume: bool = False) -> None:
        # Snapshots only when the coordinator closes: the one in storage is the final one.
        config = tmp_path / "run.yaml"
        config.write_text(yaml.safe_dump(make_config(coordinator={"snapshot_interval_s": 3600})))
        self.storage_dir = tmp_path / "storage"
        self.url = f"http://127.0.0.1:{port}"
        self.token = token
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("RLFLEET_", "GUNICORN_")) and k != "WEB_CONCURRENCY"}
        env.update(RLFLEET_CONFIG=str(config), RLFLEET_STORAGE=str(self.storage_dir),
                   RLFLEET_RUN_DIR=str(tmp_path / "run"), RLFLEET_HOST="127.0.0.1",
                   RLFLEET_PORT=str(port), RLFLEET_THREADS="4", RLFLEET_TOKEN=token,
                   RLFLEET_RESUME="1" if resume else "0")
        n = len(list(tmp_path.glob("gunicorn-*.out")))
        self.out, self.err = tmp_path / f"gunicorn-{n}.out", tmp_path / f"gunicorn-{n}.err"
        with self.out.open("w") as out, self.err.open("w") as err:
            self.proc = subprocess.Popen(COMMAND, env=env, stdout=out, stderr=err, cwd=tmp_path)
        self.http = requests.Session()
        self.http.headers["Authorization"] = f"Bearer {token}"
        wait_for(self._healthy, 60, f"gunicorn on {self.url} to answer /health")

    def _healthy(self) -> bool:
        assert self.proc.poll() is None, f"gunicorn exited {self.proc.returncode}:\n{self.log()}"
        return requests.get(f"{self.url}/health", timeout=2).json()["ok"]

    def api(self, method: str, path: str, body: dict | None = None) -> dict:
        r = self.http.request(method, f"{self.url}/api/v1{path}", json=body, timeout=10)
        assert r.status_code == 200, f"{method} {path}: {r.status_code} {r.text}"
        return r.json()

    def log(self) -> str:
        return self.err.read_text(errors="replace")

    def access_log(self) -> str:
        return self.out.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM) -> int:
        self.http.close()
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=60)

    def kill(self) -> None:
        for child in psutil.Process(self.proc.pid).children(recursive=True):
            child.kill()
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def servers():
    started: list[Gunicorn] = []
    yield started
    for g in started:
        if g.proc.poll() is None:
            g.kill()


def test_the_coordinator_under_gunicorn_stops_snapshots_and_resumes(tmp_path, servers):
    token, port = secrets.token_hex(16), free_port()
    g = Gunicorn(tmp_path, token, port)
    servers.append(g)
    assert requests.get(f"{g.url}/api/v1/status", timeout=5).status_code == 401
    assert g.api("GET", "/status")["counters"]["env_steps"] == 0

    # A collector and a learner join; the collector reports two chunks of 128 steps.
    sink = TaskSink.start()
    try:
        collector = g.api("POST", "/workers", {"role": "collector", "url": sink.url})
        g.api("POST", "/workers", {"role": "learner", "url": sink.url})
        task = sink.wait_task("collect")
        wait_for(lambda: g.api("GET", f"/tasks/{task['task_id']}")["state"] == "running", 10,
                 "the collect task running")
        chunks = [write_chunk(g, 128) for _ in range(2)]  # type: ignore[arg-type]  # storage_dir
        g.api("POST", "/chunks", {"worker_id": collector["worker_id"],
                                  "task_id": task["task_id"], "chunks": [
            {"chunk_id": cid, "length": 128, "policy_version": -1} for cid in chunks]})
    finally:
        sink.close()
    assert g.api("GET", "/status")["counters"]["env_steps"] == 256
    assert not (g.storage_dir / SNAPSHOT).exists()
    assert '"GET /health HTTP/1.1" 200' in g.access_log()
    assert '"POST /api/v1/chunks HTTP/1.1" 200' in g.access_log()

    # SIGTERM: as the in-process server, exit 0 with the final snapshot written.
    assert g.stop() == 0, g.log()
    assert (g.storage_dir / SNAPSHOT).is_file(), g.log()
    assert "Traceback" not in g.log(), g.log()

    # Started again with RLFLEET_RESUME=1, it continues from that snapshot.
    again = Gunicorn(tmp_path, token, port, resume=True)
    servers.append(again)
    status = again.api("GET", "/status")
    assert status["counters"]["env_steps"] == 256, status["counters"]
    assert status["buffer"] == {"size": 256, "chunks": 2}, status["buffer"]
    assert "restored run at 256 env steps" in again.log(), again.log()

    # Its worker dies while serving: gunicorn ends with exit 1 and boots no fresh coordinator.
    worker = psutil.Process(again.proc.pid).children()[0]
    worker.kill()
    assert again.proc.wait(timeout=60) == 1, again.log()
    assert again.log().count("Booting worker") == 1, again.log()
    assert "ended while serving" in again.log(), again.log()


def test_signals_that_would_start_a_second_coordinator_do_not(tmp_path, servers):
    """SIGTTIN (one more worker) is refused; SIGHUP (a reload: a new worker beside the old)
    stops the coordinator as SIGTERM does, final snapshot included, for its supervisor to
    start again."""
    g = Gunicorn(tmp_path, secrets.token_hex(16), free_port())
    servers.append(g)
    worker = psutil.Process(g.proc.pid).children()
    assert len(worker) == 1
    g.proc.send_signal(signal.SIGTTIN)
    wait_for(lambda: "refusing 2 workers" in g.log(), 10, "SIGTTIN refused")
    g.api("GET", "/status")  # a worker spawned by the same handler would be forked by now
    assert psutil.Process(g.proc.pid).children() == worker, g.log()
    assert g.log().count("Booting worker") == 1, g.log()
    assert g.stop(signal.SIGHUP) == 0, g.log()
    assert "a reload would run a second coordinator" in g.log(), g.log()
    assert (g.storage_dir / SNAPSHOT).is_file(), g.log()
    assert g.log().count("Booting worker") == 1, g.log()
