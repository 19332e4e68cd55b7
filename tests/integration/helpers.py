"""Helpers of the integration tests: real processes, real Redis, real HTTP; no mocks.

Events are ordered by polling a condition with a deadline (`wait_for`), never by sleeping a
guessed amount. Every process a test starts carries a unique marker in its environment, which
its children inherit, so a test can prove that nothing it started outlives it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import requests
import yaml

from rlfleet.local.forking import role_in
from rlfleet.local.launcher import Child

REPO = Path(__file__).resolve().parents[2]
BASE_CONFIG = REPO / "configs" / "cartpole-dqn.yaml"
REDIS_URL = os.environ.get("RLFLEET_TEST_REDIS", "redis://127.0.0.1:6379/0")
MARKER_VAR = "RLFLEET_TEST_MARKER"

T = TypeVar("T")


# -- waiting ------------------------------------------------------------------------------

class WaitTimeout(AssertionError):
    pass


def wait_for(predicate: Callable[[], T], timeout: float, what: str,
             interval: float = 0.1) -> T:
    """Poll `predicate` until it returns something truthy (which is returned) or `timeout`
    seconds pass; then raise naming `what` and the last value or exception seen."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            value = predicate()
        except Exception as err:  # a not-yet-ready service: remember it for the message
            last = f"{type(err).__name__}: {err}"
        else:
            if value:
                return value
            last = value
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"timed out after {timeout:.0f}s waiting for {what} "
                              f"(last seen: {last!r})")
        time.sleep(interval)


# -- configs and ports ----------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _merge(base: dict, changes: dict) -> dict:
    out = dict(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def config_from(tmp_path: Path, base: str, **changes: dict) -> Path:
    """configs/<base> with per-section changes (each section's fields updated), written to
    tmp_path/<base>."""
    data = yaml.safe_load((REPO / "configs" / base).read_text())
    for section, values in changes.items():
        data.setdefault(section, {}).update(values)
    path = tmp_path / base
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def small_config(path: Path, **sections: dict) -> Path:
    """configs/cartpole-dqn.yaml with a small budget, plus per-section overrides."""
    data = yaml.safe_load(BASE_CONFIG.read_text())
    data = _merge(data, {
        "algo": {"eps_decay_steps": 4000},
        "buffers": {"replay": {"rate_limit": {"min_size": 500}}},
        "eval": {"every_env_steps": 2000, "episodes": 4, "num_envs": 4, "stop_value": None},
        "stop": {"max_env_steps": 20_000, "max_wall_s": 150},
    })
    data = _merge(data, sections)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


# -- processes ------------------------------------------------------------------------------

def marked_env(marker: str) -> dict[str, str]:
    env = {**os.environ, MARKER_VAR: marker, "PYTHONUNBUFFERED": "1"}
    for name in ("RLFLEET_COORDINATOR", "RLFLEET_STORAGE", "RLFLEET_PORT", "RLFLEET_CONFIG"):
        env.pop(name, None)
    return env


def coordinator_url(up: Up) -> str | None:
    """The coordinator's URL, from the command line `rlfleet up` gave a worker."""
    for pid in up.descendants():
        args = proc_cmdline(pid).split()
        if "--coordinator" in args:
            return args[args.index("--coordinator") + 1]
    return None


def proc_cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def role_of(pid: int) -> str | None:
    """The rlfleet command a process runs (`rlfleet.local.forking.role_in`), None if none."""
    return role_in(proc_cmdline(pid).split())


def proc_ppid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def marked_pids(marker: str) -> list[int]:
    """Live processes whose environment carries `marker` (a test's descendants)."""
    needle = f"{MARKER_VAR}={marker}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0") and not _is_zombie(int(entry.name)):
            pids.append(int(entry.name))
    return pids


def describe(pids: list[int]) -> str:
    return "; ".join(f"{p}: {proc_cmdline(p)[:200]}" for p in pids)


class Service(Child):
    """One `python -m rlfleet <role> ...` process, in its own session so the whole group
    (a learner and its data process) can be stopped: the launcher's `Child`, plus what tests
    ask of it."""

    def get(self, path: str, timeout: float = 5.0) -> dict:
        resp = requests.get(f"{self.url}{path}", timeout=timeout)
        resp.raise_for_status()
        return resp.json()

    def wait_healthy(self, timeout: float = 60.0) -> None:
        def healthy() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited with {self.proc.returncode}:\n"
                                     f"{self.tail(40)}")
            return self.get("/health", timeout=2)["ok"]

        try:
            wait_for(healthy, timeout, f"{self.name} to answer /health")
        except WaitTimeout as err:
            raise WaitTimeout(f"{err}\n{self.tail(40)}") from None

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, then SIGKILL the whole group if it does not exit in time."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout)
        # Anything left in the group (a learner's data process) goes too.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        return self.proc.returncode


class Processes:
    """Starts services for one test and stops whatever is left in the finalizer."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.marker = uuid.uuid4().hex
        self.env = marked_env(self.marker)
        self.services: list[Service] = []

    def start(self, name: str, role: str, *args: str, port: int | None = None) -> Service:
        port = port or free_port()
        log_path = self.tmp / f"{name}.log"
        cmd = [sys.executable, "-m", "rlfleet", role, *args, "--port", str(port)]
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                    cwd=REPO, start_new_session=True)
        service = Service(name, role, proc, log_path, port)
        self.services.append(service)
        return service

    def stop_all(self) -> dict[str, int]:
        # Workers first, so they can leave cleanly while the coordinator still answers.
        codes = {}
        for service in sorted(self.services, key=lambda s: s.role == "coordinator"):
            codes[service.name] = service.stop()
        return codes

    def leftovers(self) -> list[int]:
        return marked_pids(self.marker)


# -- redis ----------------------------------------------------------------------------------

def redis_available() -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1).ping())
    except redis.RedisError:
        return False


requires_redis = pytest.mark.skipif(not redis_available(), reason=f"no Redis at {REDIS_URL}")


# -- rlfleet up as a user runs it -------------------------------------------------------------

class Up:
    """One `python -m rlfleet up ...` subprocess."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.marker = uuid.uuid4().hex
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rlfleet", "up", *args], cwd=REPO,
            env={**marked_env(self.marker), **(env or {})}, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
        self.stdout = self.stderr = ""

    def wait(self, timeout: float) -> int:
        try:
            self.stdout, self.stderr = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGINT)  # let it stop its children in order
            try:
                self.stdout, self.stderr = self.proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.stdout, self.stderr = self.proc.communicate()
            pytest.fail(f"rlfleet up did not finish within {timeout}s:\n{self.stderr[-3000:]}")
        return self.proc.returncode

    def descendants(self) -> list[int]:
        return [p for p in marked_pids(self.marker) if p != self.proc.pid]

    def assert_no_orphans(self) -> None:
        try:
            wait_for(lambda: not self.descendants(), 15,
                     "every process rlfleet up started to exit")
        except AssertionError:
            left = self.descendants()
            raise AssertionError(f"rlfleet up left processes running: {describe(left)}") \
                from None

    def kill_leftovers(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()
        for pid in self.descendants():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def metric_records(run_dir: Path) -> list[dict]:
    """The run's metrics.jsonl as records, leaving out a last line cut short by a SIGKILL."""
    path = run_dir / "metrics.jsonl"
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                out.append(json.loads(line))
    return out


def checkpoint_index(run_dir: Path) -> list[dict]:
    """The learner's checkpoint index in a directory-storage run ([] while there is none,
    or while it is being rewritten)."""
    index = run_dir / "storage" / "blobs" / "ckpt-index"
    with contextlib.suppress(FileNotFoundError, json.JSONDecodeError):
        return json.loads(index.read_text())["checkpoints"]
    return []
