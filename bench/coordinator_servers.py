"""The coordinator's two servers side by side: `rlfleet coordinator` (the app on a cheroot
thread pool in its own process) and gunicorn with the shipped config (an arbiter and one gthread
worker): the memory of the whole server and the latency of a realistic request mix.

Each server runs the same run config (CartPole DQN, a storage directory, a token, 16 threads)
as a subprocess on loopback. One client, this process, registers as a collector (so its
heartbeats are a member's) and sends the mix over one kept-alive connection, in turn:
`GET /health` (a probe), `GET /api/v1/status` (`rlfleet status`, the dashboard) and
`POST /api/v1/workers/<id>/heartbeat` (what every worker sends each interval). After
`--warmup` rounds, `--rounds` rounds are timed; then every process of the server is read:
RSS (what `ps` and a container's usage show) and PSS (shared pages split between the
processes that share them: the sum that adds up). The floor of each server is the same mix
against a trivial WSGI app (`trivial_app`: three fixed JSON answers) served the same way, by
the same server class and config, measured in the same run: what the server itself costs, and
what the client costs, beside what the coordinator's work adds.

    python -m bench.coordinator_servers [--rounds 1000] [--warmup 100] [--threads 16] [--short]

Progress goes to stderr; stdout carries the table and, as its last line, one JSON object:
`inprocess_rss_mb`, `gunicorn_rss_mb`, `inprocess_pss_mb`, `gunicorn_pss_mb`,
`inprocess_p50_ms`, `gunicorn_p50_ms`, `inprocess_p99_ms`, `gunicorn_p99_ms`, the floors'
`floor_inprocess_p50_ms`, ... and `rows` (every server and app with its processes and
per-request p50s).
"""

from __future__ import annotations

import argparse
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import requests
from rich.table import Table

from bench.common import (
    REPO_ROOT,
    TaskInbox,
    fmt,
    log,
    parse_args,
    report,
    rounded,
    run_main,
    stop_process,
    wait_healthy,
)

FIGURES = ("inprocess_rss_mb", "gunicorn_rss_mb", "inprocess_pss_mb", "gunicorn_pss_mb",
           "inprocess_p50_ms", "gunicorn_p50_ms", "inprocess_p99_ms", "gunicorn_p99_ms",
           "floor_inprocess_p50_ms", "floor_gunicorn_p50_ms")
SHORT = {"rounds": 60, "warmup": 10}
MB = 1024 * 1024
API = "/api/v1"
WORKER_ID = "bench-collector"
SERVERS = ("inprocess", "gunicorn")
APPS = ("coordinator", "trivial")


# -- the floor: a trivial app served by each server ------------------------------------------

_ANSWERS = {
    ("GET", "/health"): b'{"ok": true, "role": "coordinator"}',
    ("GET", f"{API}/status"): b'{"run": {"state": "running"}, "counters": {"env_steps": 0}}',
    ("POST", f"{API}/workers/{WORKER_ID}/heartbeat"):
        b'{"stop": false, "paused": false, "policy_version": null, "env_steps": 0}',
}


class _NullService:
    """What the servers start and close around an app (`app.extensions["rlfleet"]`): nothing."""

    on_fatal = None

    def start(self) -> _NullService:
        return self

    def close(self) -> None:
        pass


class TrivialApp:
    """A WSGI app answering the bench's mix with fixed JSON (and registering anyone), shaped as
    a role's app for the servers (`extensions`, `name`): the server's own cost, no Flask."""

    name = "trivial"

    def __init__(self) -> None:
        self.extensions = {"rlfleet": _NullService()}

    def __call__(self, environ, start_response):
        length = int(environ.get("CONTENT_LENGTH") or 0)
        if length:
            environ["wsgi.input"].read(length)
        key = (environ["REQUEST_METHOD"], environ["PATH_INFO"])
        body = _ANSWERS.get(key, b'{"worker_id": "bench-collector"}')
        start_response("200 OK", [("Content-Type", "application/json"),
                                  ("Content-Length", str(len(body)))])
        return [body]


def trivial_app() -> TrivialApp:
    """gunicorn's app factory for the floor: `bench.coordinator_servers:trivial_app()`."""
    return TrivialApp()


def serve_trivial_in_process(port: int, threads: int) -> int:
    """The floor of `rlfleet coordinator`: the same server class, with the trivial app."""
    from rlfleet.serve import InProcessServer

    return InProcessServer(TrivialApp(), "127.0.0.1", port, threads).run()  # type: ignore[arg-type]


# -- one server ---------------------------------------------------------------------------

def command(server: str, app: str, port: int, threads: int) -> list[str]:
    if server == "inprocess":
        if app == "coordinator":
            return [sys.executable, "-m", "rlfleet", "coordinator"]
        return [sys.executable, "-m", "bench.coordinator_servers", "--serve-trivial", str(port),
                "--threads", str(threads)]
    target = "rlfleet.wsgi:coordinator_app()" if app == "coordinator" \
        else "bench.coordinator_servers:trivial_app()"
    return [sys.executable, "-m", "gunicorn", "-c", "python:rlfleet.gunicorn_conf", target]


def memory_mb(pid: int) -> tuple[float, float, int]:
    """RSS and PSS summed over the server's processes (it and its children), and how many."""
    root = psutil.Process(pid)
    procs = [root, *root.children(recursive=True)]
    rss = pss = 0.0
    for p in procs:
        info = p.memory_full_info()
        rss += info.rss
        pss += info.pss
    return rss / MB, pss / MB, len(procs)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure(server: str, app: str, args: argparse.Namespace, work: Path) -> dict:
    """Start one server, time the mix, read its memory, stop it (SIGTERM: exit 0 expected)."""
    from rlfleet.cli import free_port  # here: the trivial server's process (a floor) lacks it

    port = free_port()
    token = secrets.token_hex(16)
    name = f"{server}-{app}"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RLFLEET_", "GUNICORN_")) and k != "WEB_CONCURRENCY"}
    env.update(RLFLEET_CONFIG=str(args.config), RLFLEET_STORAGE=str(work / name / "storage"),
               RLFLEET_RUN_DIR=str(work / name / "run"), RLFLEET_HOST="127.0.0.1",
               RLFLEET_PORT=str(port), RLFLEET_THREADS=str(args.threads), RLFLEET_TOKEN=token,
               RLFLEET_LOG_LEVEL="WARNING", PYTHONPATH=str(REPO_ROOT))
    err_path = work / f"{name}.err"
    with err_path.open("w") as err:
        proc = subprocess.Popen(command(server, app, port, args.threads), env=env, cwd=REPO_ROOT,
                                stdout=subprocess.DEVNULL, stderr=err)
    url = f"http://127.0.0.1:{port}"
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {token}"
    inbox = TaskInbox()
    try:
        wait_healthy(proc, url, "the server", 120.0, err_path)
        r = session.post(f"{url}{API}/workers", json={"role": "collector", "url": inbox.url,
                                                       "worker_id": WORKER_ID}, timeout=10)
        r.raise_for_status()
        mix = [("GET", "/health", None), ("GET", f"{API}/status", None),
               ("POST", f"{API}/workers/{WORKER_ID}/heartbeat",
                {"status": {"env_steps_per_s": 1234.5, "episodes": 12.0, "held_chunks": 0.0}})]
        times: dict[str, list[float]] = {path: [] for _, path, _ in mix}
        for i in range(args.warmup + args.rounds):
            for method, path, body in mix:
                t0 = time.perf_counter()
                r = session.request(method, f"{url}{path}", json=body, timeout=30)
                dt = time.perf_counter() - t0
                r.raise_for_status()
                if i >= args.warmup:
                    times[path].append(dt * 1000)
        rss, pss, processes = memory_mb(proc.pid)
    finally:
        session.close()
        inbox.close()
        code = stop_process(proc, 60.0)
    if code != 0:
        raise RuntimeError(f"{name} exited {code} on SIGTERM:\n{err_path.read_text()[-2000:]}")
    every = [t for ts in times.values() for t in ts]
    row = {"server": server, "app": app, "processes": processes, "rss_mb": rounded(rss, 1),
           "pss_mb": rounded(pss, 1), "p50_ms": rounded(percentile(every, 0.5)),
           "p99_ms": rounded(percentile(every, 0.99)), "requests": len(every),
           "p50_ms_by_request": {p: rounded(percentile(ts, 0.5)) for p, ts in times.items()}}
    log(f"{name}: {processes} processes, RSS {rss:.1f} MB, PSS {pss:.1f} MB, "
        f"p50 {row['p50_ms']} ms, p99 {row['p99_ms']} ms")
    return row


# -- the run --------------------------------------------------------------------------------

def run(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="coordinator-servers-") as tmp:
        rows = [measure(server, app, args, Path(tmp)) for app in APPS for server in SERVERS]
    by = {(r["server"], r["app"]): r for r in rows}
    result: dict = {}
    for server in SERVERS:
        row = by[(server, "coordinator")]
        result.update({f"{server}_rss_mb": row["rss_mb"], f"{server}_pss_mb": row["pss_mb"],
                       f"{server}_p50_ms": row["p50_ms"], f"{server}_p99_ms": row["p99_ms"]})
    for server in SERVERS:
        floor = by[(server, "trivial")]
        result.update({f"floor_{server}_p50_ms": floor["p50_ms"],
                       f"floor_{server}_p99_ms": floor["p99_ms"],
                       f"floor_{server}_rss_mb": floor["rss_mb"]})
    result.update(rounds=args.rounds, threads=args.threads, rows=rows)
    return result


def table(rows: list[dict]) -> Table:
    t = Table(title="the coordinator's servers: memory of the whole server, latency of the mix "
                    "(one kept-alive client)")
    for col in ("server", "app", "processes", "RSS MB", "PSS MB", "p50 ms", "p99 ms",
                "health p50", "status p50", "heartbeat p50"):
        t.add_column(col, justify="left" if col in ("server", "app") else "right")
    for r in rows:
        by_request = list(r["p50_ms_by_request"].values())
        t.add_row(r["server"], r["app"] if r["app"] == "coordinator" else "trivial (floor)",
                  str(r["processes"]), fmt(r["rss_mb"]), fmt(r["pss_mb"]),
                  fmt(r["p50_ms"], ".2f"), fmt(r["p99_ms"], ".2f"),
                  *(fmt(v, ".2f") for v in by_request))
    return t


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.coordinator_servers", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", type=Path, default=REPO_ROOT / "configs" / "cartpole-dqn.yaml")
    p.add_argument("--rounds", type=int, default=1000, help="timed rounds of the mix")
    p.add_argument("--warmup", type=int, default=100, help="untimed rounds first")
    p.add_argument("--threads", type=int, default=16, help="each server's threads")
    p.add_argument("--serve-trivial", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parse_args(p, argv, SHORT)
    if args.serve_trivial is not None:  # a child: the in-process server's floor
        return serve_trivial_in_process(args.serve_trivial, args.threads)
    result = run(args)
    report(result, table(result["rows"]))
    return 0


if __name__ == "__main__":
    run_main(main)
