"""docker-compose.yml driven from Python, for the compose test and `bench.compose`: a
Docker engine found or started, the image built, a stack brought up under its own project
name and host port, its coordinator's API, its containers crashed or killed, and proof that
`docker compose down -v` left nothing behind.

Everything goes through the `docker` CLI and its compose plugin, as a user would type it.

The engine: one that answers already (DOCKER_HOST), or the one `.ci/run` is starting in the
background (it writes the exports to $RLFLEET_DOCKER_ENV when ready), or one started here
with the workplace's script (`../shared/docker/engine.sh start`, which installs Debian's
docker.io and builds local stand-ins for the two base images where no registry answers).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import requests

from bench.common import REPO_ROOT

API = "/api/v1"
ENGINE_SCRIPTS = (REPO_ROOT.parent / "shared" / "docker" / "engine.sh",
                  Path("/work/shared/docker/engine.sh"))
PROJECT_LABEL = "com.docker.compose.project"


class EngineUnavailable(RuntimeError):
    """No Docker engine can be had on this machine (the reason says why)."""


def _docker_ok(env: dict[str, str]) -> bool:
    try:
        return subprocess.run(["docker", "info"], env=env, capture_output=True,
                              timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _parse_exports(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("export "):
            for word in shlex.split(line[len("export "):]):
                key, _, value = word.partition("=")
                out[key] = value
    return out


def ensure_engine(wait_s: float = 900.0) -> tuple[dict[str, str], Path | None]:
    """The environment to run `docker` with, and the script to stop the engine with when
    this call started it (None when it answered already, or CI owns it)."""
    env = dict(os.environ)
    if os.environ.get("DOCKER_HOST") and _docker_ok(env):
        return env, None
    ready = os.environ.get("RLFLEET_DOCKER_ENV")
    if ready:  # .ci/run is starting one in the background
        path, failed = Path(ready), Path(ready + ".failed")
        deadline = time.monotonic() + wait_s
        while not path.exists() and not failed.exists() and time.monotonic() < deadline:
            time.sleep(2)
        if path.exists():
            env.update(_parse_exports(path.read_text()))
            if _docker_ok(env):
                return env, None
    if _docker_ok(env):
        return env, None
    script = next((p for p in ENGINE_SCRIPTS if p.exists()), None)
    if script is None:
        raise EngineUnavailable("no Docker engine answers (DOCKER_HOST unset or dead) and the "
                                "workplace's engine script (../shared/docker/engine.sh) is "
                                "not here to start one")
    if os.geteuid() != 0:
        raise EngineUnavailable("starting a Docker engine needs root")
    out = subprocess.run(["bash", str(script), "start"], capture_output=True, text=True,
                         timeout=wait_s)
    if out.returncode != 0:
        raise EngineUnavailable(f"{script} start failed: {out.stderr[-2000:]}")
    env.update(_parse_exports(out.stdout))
    if not _docker_ok(env):
        raise EngineUnavailable(f"{script} started an engine that does not answer")
    return env, script


def torch_index(env: dict[str, str]) -> str | None:
    """The Dockerfile's TORCH_INDEX build argument: empty where the base image is the local
    stand-in that finds torch on this machine's wheel server; the Dockerfile's default (the
    PyTorch CPU index) everywhere else."""
    out = subprocess.run(["docker", "image", "inspect", "python:3.11-slim", "--format",
                          "{{json .Config.Env}}"], env=env, capture_output=True, text=True)
    if out.returncode == 0 and "PIP_FIND_LINKS" in out.stdout:
        return ""
    return None


def build_image(env: dict[str, str], tag: str = "rlfleet:latest", cached: bool = True) -> float:
    """`docker build` of services/Dockerfile; its wall seconds (a few when cached). Not
    `cached` (`--no-cache`), the build is what is timed: it is given no time limit."""
    cmd = ["docker", "build", "-q", "--network", "host", "-f", "services/Dockerfile",
           "-t", tag]
    if not cached:
        cmd.append("--no-cache")
    index = torch_index(env)
    if index is not None:
        cmd += ["--build-arg", f"TORCH_INDEX={index}"]
    t0 = time.monotonic()
    out = subprocess.run([*cmd, "."], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                         timeout=1200 if cached else None)
    if out.returncode != 0:
        raise RuntimeError(f"docker build failed:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
    return time.monotonic() - t0


class Stack:
    """One `docker compose` project: the repository's docker-compose.yml plus overrides."""

    def __init__(self, project: str, env: dict[str, str], token: str, port: int,
                 overrides: list[Path] = (), profiles: list[str] = ()) -> None:
        self.project = project
        self.token = token
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.env = dict(env, RLFLEET_TOKEN=token, RLFLEET_PORT=str(port),
                        COMPOSE_PROJECT_NAME=project)
        host = self.env.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        if host.startswith("unix://"):  # what the scaler mounts
            self.env["RLFLEET_DOCKER_SOCKET"] = host[len("unix://"):]
        self.files = [REPO_ROOT / "docker-compose.yml", *overrides]
        self.profiles = list(profiles)
        self.http = requests.Session()
        self.http.headers["Authorization"] = f"Bearer {token}"

    # -- docker and compose ----------------------------------------------------------------

    def compose(self, *args: str, timeout: float = 300, check: bool = True
                ) -> subprocess.CompletedProcess:
        cmd = ["docker", "compose", "-p", self.project, "--project-directory", str(REPO_ROOT)]
        for f in self.files:
            cmd += ["-f", str(f)]
        for p in self.profiles:
            cmd += ["--profile", p]
        out = subprocess.run([*cmd, *args], env=self.env, capture_output=True, text=True,
                             timeout=timeout)
        if check and out.returncode != 0:
            raise RuntimeError(f"docker compose {' '.join(args)} failed:\n{out.stderr[-3000:]}")
        return out

    def docker(self, *args: str, timeout: float = 60, check: bool = True
               ) -> subprocess.CompletedProcess:
        out = subprocess.run(["docker", *args], env=self.env, capture_output=True, text=True,
                             timeout=timeout)
        if check and out.returncode != 0:
            raise RuntimeError(f"docker {' '.join(args)} failed:\n{out.stderr[-3000:]}")
        return out

    def up(self, *args: str) -> None:
        self.compose("up", "-d", "--no-build", *args, timeout=600)

    def down(self) -> None:
        """Everything the project made goes: containers (the scaler's too: they carry its
        labels), its network and its volumes."""
        self.compose("down", "-v", "--remove-orphans", "--timeout", "10", timeout=300,
                     check=False)

    def containers(self, service: str | None = None, everything: bool = False
                   ) -> list[dict[str, Any]]:
        """`docker ps` rows of the project (of one service), by container number."""
        cmd = ["ps", "--no-trunc", "--format", "{{json .}}",
               "--filter", f"label={PROJECT_LABEL}={self.project}"]
        if service:
            cmd += ["--filter", f"label=com.docker.compose.service={service}"]
        if everything:
            cmd.append("-a")
        rows = [json.loads(line) for line in self.docker(*cmd).stdout.splitlines() if line]
        return sorted(rows, key=lambda r: _label(r, "com.docker.compose.container-number"))

    def inspect(self, name: str) -> dict[str, Any]:
        return json.loads(self.docker("inspect", name).stdout)[0]

    def crash(self, name: str) -> int:
        """SIGKILL the container's main process from the host: a crash, which the restart
        policy answers (`docker kill` is a stop by hand, which it does not). Its restart
        count before."""
        info = self.inspect(name)
        os.kill(info["State"]["Pid"], signal.SIGKILL)
        return int(info["RestartCount"])

    def logs(self, service: str) -> str:
        return self.compose("logs", "--no-color", service, check=False).stdout

    def leftovers(self) -> dict[str, list[str]]:
        """What of the project is still there after `down -v`."""
        label = f"label={PROJECT_LABEL}={self.project}"
        found = {
            "containers": self.docker("ps", "-aq", "--filter", label).stdout.split(),
            "volumes": self.docker("volume", "ls", "-q", "--filter", label).stdout.split(),
            "networks": self.docker("network", "ls", "-q", "--filter", label).stdout.split(),
        }
        return {k: v for k, v in found.items() if v}

    # -- the coordinator's API -------------------------------------------------------------

    def get(self, path: str) -> dict:
        r = self.http.get(f"{self.url}{API}{path}", timeout=5)
        r.raise_for_status()
        return r.json()

    def status(self) -> dict:
        return self.get("/status")

    def post(self, path: str, body: dict) -> dict:
        r = self.http.post(f"{self.url}{API}{path}", json=body, timeout=10)
        r.raise_for_status()
        return r.json()


def _label(row: dict[str, Any], key: str) -> int:
    for item in row.get("Labels", "").split(","):
        k, _, v = item.partition("=")
        if k == key:
            try:
                return int(v)
            except ValueError:
                return 0
    return 0
