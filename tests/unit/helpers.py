"""Plain helpers for the unit tests (the fixtures built on them live in conftest.py): polling
with a deadline, free ports, the test config, a fake worker that records pushed tasks, real
coordinator processes, and the calls tests make to them as workers would."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import requests
import yaml
from pydantic import ValidationError

from rlfleet.shared.contract.codec import encode_arrays
from rlfleet.shared.contract.wire.tasks import TaskEnvelope
from rlfleet.shared.infra.storage import DirectoryStorage

REPO = Path(__file__).resolve().parents[2]
CARTPOLE_DQN = REPO / "configs" / "cartpole-dqn.yaml"
REDIS_URL = "redis://127.0.0.1:6379/0"


def wait_for(condition: Callable[[], object], timeout_s: float = 10.0, interval_s: float = 0.02,
             what: str = "condition") -> object:
    """Poll `condition` until it returns something truthy, or fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(interval_s)


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (from /proc), children first."""
    out: list[int] = []
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return out
    for child in map(int, children):
        out.append(child)
        out += descendants(child)
    return out


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL a server and every process below it at once: a crash, not a shutdown
    (SIGTERM would let it close cleanly)."""
    pids = [proc.pid, *descendants(proc.pid)]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)
    proc.wait(timeout=10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def closed_port() -> int:
    """A loopback port nothing listens on (bound, released, never listened on)."""
    return free_port()


def buffer_config(**changes) -> dict:
    """The test config's one uniform buffer ("replay"), with fields changed.

    Its rate limit, in items of the config's batch size 64: sampling starts at 256
    transitions, then 0.25 updates per env step (16 items per item inserted), and either side
    may run 1000 updates (64,000 items) ahead before it waits."""
    buf = {"kind": "uniform", "capacity": 100_000,
           "rate_limit": {"min_size": 256, "samples_per_insert": 16, "error_buffer": 64_000}}
    buf.update(changes)
    return buf


def make_config(**overrides: dict) -> dict:
    """configs/cartpole-dqn.yaml with small numbers for tests; `overrides` are merged per
    section (`algo={"lr": 0.1}` changes one field of `algo`), except `buffers`, which is
    replaced as a whole: buffer names are each test's own (start from `buffer_config()`),
    and `algo` when it names another algorithm."""
    cfg = yaml.safe_load(CARTPOLE_DQN.read_text())
    cfg["buffers"] = {"replay": buffer_config()}
    cfg["eval"].update(every_env_steps=512)
    # Snapshots often: released chunks are deleted from storage only after the next one.
    cfg["coordinator"] = {"heartbeat_interval_s": 0.2, "heartbeat_timeout_s": 60.0,
                          "task_push_timeout_s": 2.0, "snapshot_interval_s": 0.3}
    cfg["stop"] = {"max_wall_s": 300}
    for section, values in overrides.items():
        switch_algo = section == "algo" and values.get("name", "dqn") != "dqn"
        if isinstance(values, dict) and section != "buffers" and not switch_algo:
            cfg.setdefault(section, {}).update(values)
        else:
            cfg[section] = values
    return cfg


# -- a fake worker: a real HTTP server that accepts pushed tasks ----------------------------

@dataclass
class TaskSink:
    """A real HTTP server on loopback that answers `POST /task` like a worker (after
    validating the body as a `TaskEnvelope`) and records every task it was sent."""

    server: ThreadingHTTPServer
    bodies: list[dict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    cond: threading.Condition = field(default_factory=threading.Condition)

    @classmethod
    def start(cls) -> TaskSink:
        sink: TaskSink

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path != "/task":
                    self.send_error(404)
                    return
                try:  # the coordinator must send what a real worker accepts
                    TaskEnvelope.model_validate_json(body)
                except ValidationError as err:
                    with sink.cond:
                        sink.errors.append(str(err))
                    self.send_error(400)
                    return
                envelope = json.loads(body)
                with sink.cond:
                    sink.bodies.append(envelope)
                    sink.cond.notify_all()
                answer = json.dumps({"task_id": envelope["task"]["task_id"],
                                     "accepted": True}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                if self.path != "/health":  # as a worker's app: the coordinator probes it
                    self.send_error(404)
                    return
                answer = b'{"ok": true, "role": "sink"}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        sink = cls(server)
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                         name="task-sink", daemon=True).start()
        return sink

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def tasks(self, kind: str | None = None) -> list[dict]:
        with self.cond:
            return [b["task"] for b in self.bodies if kind is None or b["task"]["kind"] == kind]

    def wait_task(self, kind: str, timeout_s: float = 10.0) -> dict:
        """The latest `kind` task, waiting for the first one if none came yet."""
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while not (found := self.tasks(kind)):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no {kind} task pushed to {self.url} in {timeout_s}s; "
                                         f"got {self.bodies}")
                self.cond.wait(left)
            return found[-1]

    def expect_none(self, kind: str, within_s: float, after: int = 0) -> None:
        """Asserting an absence needs a window: no `kind` task beyond the first `after` may
        arrive within it."""
        deadline = time.monotonic() + within_s
        with self.cond:
            while (left := deadline - time.monotonic()) > 0:
                assert len(self.tasks(kind)) <= after, f"unexpected {kind} task: " \
                    f"{self.tasks(kind)}"
                self.cond.wait(left)
            assert len(self.tasks(kind)) <= after, f"unexpected {kind} task: {self.tasks(kind)}"


# -- real coordinator processes ------------------------------------------------------------------

@dataclass
class CoordinatorProc:
    url: str
    storage_dir: Path
    run_dir: Path
    config: dict
    proc: subprocess.Popen
    log_path: Path
    token: str | None = None  # the RLFLEET_TOKEN it was started with, sent by `status()`

    def api(self, path: str) -> str:
        return f"{self.url}/api/v1{path}"

    def status(self) -> dict:
        headers = {"Connection": "close"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        r = requests.get(self.api("/status"), timeout=5, headers=headers)
        r.raise_for_status()
        return r.json()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


class CoordinatorPool:
    """Starts `python -m rlfleet coordinator` subprocesses on free ports.

    Booting one takes a while (the interpreter's start and imports), nearly all of it on one
    core, so a test module can `prewarm` the coordinators its tests will ask for: they boot
    side by side, and `take` hands out a booted one with the same overrides. `release` sends
    SIGTERM; `close` waits for every process (killing one that does not exit).
    """

    def __init__(self, tmp_dir: Path) -> None:
        self.tmp_dir = tmp_dir
        self.spares: list[tuple[dict, CoordinatorProc]] = []
        self.procs: list[CoordinatorProc] = []

    def prewarm(self, *override_sets: dict) -> None:
        for overrides in override_sets:
            self.spares.append((overrides, self._spawn(overrides)))

    def take(self, *, environ: dict[str, str] | None = None, **overrides: dict
             ) -> CoordinatorProc:
        """A healthy coordinator with the test config changed by `overrides`; `environ` adds
        variables to its environment (then it is never a prewarmed spare)."""
        for i, (spare_overrides, _) in enumerate(self.spares):
            if spare_overrides == overrides and not environ:
                c = self.spares.pop(i)[1]
                break
        else:
            c = self._spawn(overrides, environ=environ)
        self._wait_healthy(c)
        return c

    def start(self, config: dict, storage_dir: Path | str, *args: str,
              environ: dict[str, str] | None = None) -> CoordinatorProc:
        """A healthy coordinator on a given config and storage (a directory, or a Redis
        URL; for restarts: a second one on the same storage, with `--resume`), never a
        prewarmed spare."""
        c = self._spawn(None, config=config, storage_dir=storage_dir, args=args,
                        environ=environ)
        self._wait_healthy(c)
        return c

    @staticmethod
    def release(c: CoordinatorProc) -> None:
        if c.proc.poll() is None:
            c.proc.terminate()

    @staticmethod
    def stop(c: CoordinatorProc, timeout_s: float = 20.0) -> int:
        """SIGTERM, and wait for the exit code (what closing did is then in storage)."""
        if c.proc.poll() is None:
            c.proc.terminate()
        try:
            return c.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            c.proc.kill()
            c.proc.wait(timeout=10)
            raise AssertionError(f"coordinator ignored SIGTERM for {timeout_s}s:\n{c.log()}") \
                from None

    def close(self) -> None:
        for c in self.procs:
            self.release(c)
        for c in self.procs:
            try:
                c.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                c.proc.kill()
                c.proc.wait(timeout=10)

    def _spawn(self, overrides: dict | None, config: dict | None = None,
               storage_dir: Path | str | None = None, args: tuple[str, ...] = (),
               environ: dict[str, str] | None = None) -> CoordinatorProc:
        n = len(self.procs)
        # A token in the developer's shell must not guard the coordinators tests talk to
        # without one; a test that wants one passes it in `environ`.
        env = {k: v for k, v in os.environ.items()
               if k not in ("RLFLEET_TOKEN", "RLFLEET_TOKEN_FILE")}
        env.update(environ or {})
        cfg = config if config is not None else make_config(**(overrides or {}))
        cfg_path = self.tmp_dir / f"coordinator-{n}.yaml"
        cfg_path.write_text(yaml.safe_dump(cfg))
        port = free_port()
        run_dir = self.tmp_dir / f"run-{n}"
        storage_dir = storage_dir or self.tmp_dir / f"storage-{n}"
        log_path = self.tmp_dir / f"coordinator-{n}.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "rlfleet", "coordinator", "--config", str(cfg_path),
                 "--port", str(port), "--run-dir", str(run_dir), "--storage", str(storage_dir),
                 "--threads", "8", *args],
                cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env)
        c = CoordinatorProc(f"http://127.0.0.1:{port}", storage_dir, run_dir, cfg, proc,
                            log_path, env.get("RLFLEET_TOKEN"))
        self.procs.append(c)
        return c

    @staticmethod
    def _wait_healthy(c: CoordinatorProc) -> None:
        def healthy() -> bool:
            if c.proc.poll() is not None:
                raise AssertionError(f"coordinator exited with {c.proc.returncode}:\n{c.log()}")
            try:
                return requests.get(f"{c.url}/health", timeout=1,
                                    headers={"Connection": "close"}).ok
            except (requests.ConnectionError, requests.Timeout):  # still booting
                return False

        wait_for(healthy, timeout_s=30, what="coordinator /health")


# -- talking to a coordinator as workers do ------------------------------------------------

TIMEOUT = 10

# Every request closes its connection, so no kept-alive socket held by a stray Response object
# outlives it: a server's graceful shutdown may wait for an open connection.
HTTP = requests.Session()
HTTP.headers["Connection"] = "close"


def post(c: CoordinatorProc, path: str, body=None, **kw) -> requests.Response:
    return HTTP.post(c.api(path), json=body, timeout=TIMEOUT, **kw)


def get(c: CoordinatorProc, path: str) -> dict:
    return ok(HTTP.get(c.api(path), timeout=TIMEOUT))


def ok(resp: requests.Response) -> dict:
    assert resp.status_code == 200, f"{resp.status_code}: {resp.text}"
    return resp.json()


def register(c: CoordinatorProc, role: str, sink: TaskSink, worker_id: str | None = None
             ) -> dict:
    body = {"role": role, "url": sink.url}
    if worker_id is not None:
        body["worker_id"] = worker_id
    return ok(post(c, "/workers", body))


def task_state(c: CoordinatorProc, task_id: str) -> str:
    return get(c, f"/tasks/{task_id}")["state"]


def wait_running(c: CoordinatorProc, task_id: str) -> None:
    wait_for(lambda: task_state(c, task_id) == "running", what=f"task {task_id} running")


def write_chunk(c: CoordinatorProc, n: int, chunk_id: str | None = None,
                version: int = -1) -> str:
    """Write a real chunk into the coordinator's storage directory, as a collector would."""
    chunk_id = chunk_id or uuid.uuid4().hex
    rng = np.random.default_rng(zlib.crc32(chunk_id.encode()))
    arrays = {"obs": rng.standard_normal((n, 4)).astype(np.float32),
              "action": rng.integers(0, 2, n).astype(np.int64),
              "reward": np.ones(n, np.float32),
              "next_obs": rng.standard_normal((n, 4)).astype(np.float32),
              "terminated": np.zeros(n, bool), "truncated": np.zeros(n, bool)}
    DirectoryStorage(c.storage_dir).put_chunk(
        chunk_id, encode_arrays(arrays, {"policy_version": str(version)}))
    return chunk_id


def report(c: CoordinatorProc, worker_id: str, task_id: str, chunks: list[tuple[str, int]],
           **meta) -> requests.Response:
    """Announce chunks; `meta` goes into each chunk's metadata (policy_version -1 unless
    given)."""
    meta = {"policy_version": -1, **meta}
    return post(c, "/chunks", {"worker_id": worker_id, "task_id": task_id, "chunks": [
        {"chunk_id": cid, "length": n, **meta} for cid, n in chunks]})


def collector_and_learner(c: CoordinatorProc, make_sink) -> tuple[dict, dict, dict, dict]:
    """Register one of each with a fake worker server; returns (collector, collect task,
    learner, learn task) once both tasks were pushed and acknowledged."""
    col_sink, lrn_sink = make_sink(), make_sink()
    col = register(c, "collector", col_sink)
    lrn = register(c, "learner", lrn_sink)
    collect = col_sink.wait_task("collect")
    learn = lrn_sink.wait_task("learn")
    wait_running(c, collect["task_id"])
    wait_running(c, learn["task_id"])
    assert not col_sink.errors and not lrn_sink.errors
    return col, collect, lrn, learn


def prewarm_module(request, pool, boots: dict[str, dict],
                   for_fixtures: dict[str, dict] | None = None) -> None:
    """Boot, side by side, the coordinators the selected tests of the requesting module will
    take: `boots` maps test names to configs, `for_fixtures` fixture names to configs."""
    mine = [item for item in request.session.items if item.module is request.module]
    names = {item.originalname for item in mine}
    configs = [cfg for name, cfg in boots.items() if name in names]
    for fixture, cfg in (for_fixtures or {}).items():
        if any(fixture in item.fixturenames for item in mine):
            configs.append(cfg)
    pool.prewarm(*configs)


def comparable_status(c: CoordinatorProc) -> dict:
    """/status without what moves with the clock, for "this request changed nothing"."""
    s = c.status()
    s["run"].pop("wall_seconds")
    s.pop("rates")
    for b in s["buffers"].values():
        b.pop("inserts_per_s")
        b.pop("samples_per_s")
    for w in s["workers"]:
        w.pop("seconds_since_heartbeat")
    s["metrics"] = {k: v for k, v in s["metrics"].items() if not k.endswith("_per_s")}
    for key in ("unannounced", "journal_generation"):  # garbage collection, snapshots
        s["ledger"].pop(key)
    return s
