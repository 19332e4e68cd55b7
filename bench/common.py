"""What the benchmarks share: their entry and output conventions, configs written for a run,
`rlfleet up` and a local cluster driven step by step, waiting on a condition, rates over
windows with CPU accounting, storage handling, and playing a collector (prefilling a buffer
with no collector process).

Every bench is a module run from the repository root, `python -m bench.<name> [options]`,
whose `__main__` is `run_main(main)`. Conventions: progress goes to stderr; stdout carries the
human tables (rich) and, as its very last line, one JSON object (`report`, `emit`), so
`python -m bench.x | tail -n1` is machine-readable. Every bench names the keys of that object
it measures in a module-level `FIGURES` tuple, and takes `--short` (`parse_args`): a run of
seconds that still measures each of them, which `tests/integration/test_benches.py` runs so
that a bench cannot break unseen.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from functools import cached_property
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, Self, TypeVar

from rich.console import Console

if TYPE_CHECKING:  # imported where used: a bench pays only for what it uses
    from pydantic import BaseModel

    from rlfleet.local.launcher import Child, LocalCluster
    from rlfleet.shared.infra.http import HttpClient

T = TypeVar("T")

REPO_ROOT = Path(__file__).resolve().parents[1]

progress = Console(stderr=True, highlight=False)


def log(message: str) -> None:
    progress.print(f"[dim]bench[/] {message}")


def print_tables(*tables) -> None:
    """The human part of stdout; wide enough that the columns are not squeezed in a pipe."""
    out = Console(width=max(140, shutil.get_terminal_size().columns), highlight=False)
    for table in tables:
        out.print(table)


def emit(result: dict) -> None:
    """The machine part of stdout: one JSON object, the very last line."""
    sys.stdout.flush()
    print(json.dumps(result, sort_keys=False), flush=True)


def report(result: dict, *tables) -> None:
    """A bench's whole stdout: its tables for a reader, then `result` as the last line for a
    program (`| tail -n1`)."""
    print_tables(*tables)
    emit(result)


def run_main(main: Callable[[], int]) -> NoReturn:
    """A bench's `__main__`: SIGTERM and SIGHUP end it as Ctrl-C does (`exit_on_signals`), so
    the clusters it started stop with it, and `main`'s return is its exit code."""
    exit_on_signals()
    sys.exit(main())


# -- short mode and declared figures --------------------------------------------------------

SHORT_HELP = ("a smoke run of seconds: windows, seeds, repeats and sizes shrunk, every figure "
              "still measured (the tests run each bench so); options given here still win")


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None,
               short: Mapping[str, Any]) -> argparse.Namespace:
    """`parser`'s arguments with `--short` added. With `--short`, `short` (argparse dests to
    values) replaces those defaults, and options on the command line still win over it: the
    short run is the same bench with smaller defaults, not another code path that could
    drift from the real one. A name in `short` that the parser lacks is an error, so a
    renamed option cannot silently leave a short run long."""
    dests = {action.dest for action in parser._actions}
    unknown = sorted(set(short) - dests)
    if unknown:
        raise ValueError(f"short-mode defaults {unknown} name no option of {parser.prog}")
    parser.add_argument("--short", action="store_true", help=SHORT_HELP)
    args = parser.parse_args(argv)
    if args.short:
        parser.set_defaults(**short)
        args = parser.parse_args(argv)
    return args


def declared_figures(script: Path) -> tuple[str, ...] | None:
    """A bench script's `FIGURES` (the keys its last JSON line must hold), read from its source
    without importing it: a test lists them even where the bench's imports fail (its run
    then shows why), and no import of torch or Docker's client is paid for a list of names.
    None where the script declares none."""
    for node in ast.parse(script.read_text(), str(script)).body:
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "FIGURES" for t in targets):
                assert node.value is not None
                return tuple(ast.literal_eval(node.value))
    return None


def missing_figures(result: Mapping[str, Any], figures: Iterable[str]) -> list[str]:
    """The figures that `result` lacks or holds as null; a figure that is a mapping (one value
    per role, per count) counts as missing where any value in it is null (`key.sub`)."""
    missing: list[str] = []

    def walk(name: str, value: Any) -> None:
        if value is None:
            missing.append(name)
        elif isinstance(value, Mapping):
            if not value:
                missing.append(name)
            for key, sub in value.items():
                walk(f"{name}.{key}", sub)

    for key in figures:
        if key not in result:
            missing.append(key)
        else:
            walk(key, result[key])
    return missing


# -- numbers ------------------------------------------------------------------------------

def median(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return float(statistics.median(present)) if present else None


def ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den == 0:
        return None
    return num / den


def fmt(value: float | int | None, spec: str = ".1f", suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def rounded(value: float | None, digits: int = 3) -> float | int | None:
    if value is None:
        return None
    return int(round(value)) if digits == 0 else round(value, digits)


# -- configs and storage ------------------------------------------------------------------

def write_yaml(path: Path, data: Mapping[str, Any] | BaseModel) -> Path:
    """A config written where a run (or a launcher) reads it: a model as its JSON form, keys
    in their order."""
    import yaml
    from pydantic import BaseModel

    if isinstance(data, BaseModel):
        data = data.model_dump(mode="json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(dict(data), sort_keys=False))
    return path


def free_running_data(base: Path, name: str, storage: str, epsilon: float) -> dict:
    """The base config as a dict, made free-running for a throughput measurement: no
    replay-ratio throttling, no evaluations, no stop rule, and a constant epsilon (so every
    collector acts alike from its first step, whatever the run's env step count)."""
    from rlfleet.shared.run.config import load_config

    data = load_config(base).model_dump(mode="json")
    data["name"] = name
    data["storage"] = storage
    data["algo"].update(eps_start=epsilon, eps_end=epsilon)
    for buffer in data["buffers"].values():
        buffer["rate_limit"]["samples_per_insert"] = None
    data["eval"].update(every_env_steps=10**12, stop_value=None)
    data["stop"] = {"max_env_steps": None, "max_wall_s": None}
    return data


def is_redis(url: str) -> bool:
    return url.startswith(("redis://", "rediss://", "unix://"))


def clear_storage(url: str, namespace: str) -> None:
    """Drop one run's data: its Redis keys, or its directory."""
    if is_redis(url):
        from rlfleet.shared.infra.storage import RedisStorage

        store = RedisStorage(url, namespace)
        try:
            store.clear()
        finally:
            store.close()
    else:
        shutil.rmtree(url.removeprefix("file://"), ignore_errors=True)


# -- CPU accounting (Linux /proc) ---------------------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def child_pids(pid: int) -> list[int]:
    """A process's children's pids, from /proc (every thread's `children`)."""
    kids: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                kids += [int(k) for k in f.read().split()]
    except OSError:
        pass
    return kids


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) used so far by a process and its live descendants
    (a learner's data process is its child)."""
    total, stack = 0.0, [pid]
    while stack:
        p = stack.pop()
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime
        except (OSError, IndexError, ValueError):
            continue
        stack += child_pids(p)
    return total


def machine_busy_s() -> float:
    """CPU seconds all cores spent busy since boot (everything but idle and iowait)."""
    try:
        with open("/proc/stat") as f:
            parts = [int(x) for x in f.readline().split()[1:]]
    except OSError:
        return 0.0
    idle = parts[3] + (parts[4] if len(parts) > 4 else 0)
    return (sum(parts[:8]) - idle) / _TICK


class CpuWindow:
    """CPU used by named process trees, and by everything else on the machine, between
    `start()` and `stop()`; shown beside a figure so a noisy neighbour is visible."""

    def __init__(self, pids: dict[str, int], include_self: bool = True) -> None:
        self.pids = pids
        self.include_self = include_self
        self.used: dict[str, float] = {}
        self.others = 0.0
        self.seconds = 0.0

    def start(self, now: float) -> CpuWindow:
        self._t0 = now
        self._cpu0 = self._sample()
        self._busy0 = machine_busy_s()
        return self

    def stop(self, now: float) -> CpuWindow:
        self.seconds = max(now - self._t0, 1e-9)
        self.used = {name: cpu - self._cpu0[name] for name, cpu in self._sample().items()}
        self.others = max(0.0, machine_busy_s() - self._busy0 - sum(self.used.values()))
        return self

    def _sample(self) -> dict[str, float]:
        cpu = {name: tree_cpu_s(pid) for name, pid in self.pids.items()}
        if self.include_self:  # this process alone: its children are named in `pids`
            cpu["bench"] = time.process_time()
        return cpu

    def cores(self, name: str) -> float:
        return self.used.get(name, 0.0) / self.seconds

    def others_cores(self) -> float:
        return self.others / self.seconds

    def describe(self) -> str:
        parts = [f"{name} {self.cores(name):.2f}" for name in self.used]
        parts.append(f"others {self.others_cores():.2f}")
        return ", ".join(parts) + f" cores (of {os.cpu_count()})"


# -- playing a collector ------------------------------------------------------------------

class TaskInbox:
    """A worker's `POST /task` endpoint and nothing more, on a loopback port: what a benchmark
    registers when it plays a worker itself. It accepts every task and keeps its body."""

    def __init__(self) -> None:
        inbox = self
        self.tasks: list[dict] = []
        self._cond = threading.Condition()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                if self.path != "/task":
                    self.send_error(404)
                    return
                with inbox._cond:
                    inbox.tasks.append(body["task"])
                    inbox._cond.notify_all()
                self._answer({"task_id": body["task"]["task_id"], "accepted": True})

            def do_GET(self) -> None:  # noqa: N802
                if self.path == "/health":
                    self._answer({"status": "ok"})
                else:
                    self.send_error(404)

            def _answer(self, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.1},
                         name="task-inbox", daemon=True).start()

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def wait_task(self, kind: str, timeout_s: float = 30.0) -> dict:
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not (found := [t for t in self.tasks if t["kind"] == kind]):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(f"no {kind} task pushed to {self.url} in {timeout_s:g} s")
                self._cond.wait(left)
            return found[-1]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def prefill(coordinator_url: str, storage: str, namespace: str,
            chunks: Iterable[dict], worker_id: str = "bench-prefill",
            per_report: int = 100) -> int:
    """Fill the run's buffers without a collector process, the way a collector does it: register
    as a collector, take the collect task the coordinator pushes, write each chunk (named
    arrays, one row per transition) to storage, report its metadata, and leave. Returns the
    transitions reported (the coordinator's `buffer.size` says what its buffers hold)."""
    from rlfleet.shared.contract.codec import encode_arrays
    from rlfleet.shared.contract.wire.base import API, Role
    from rlfleet.shared.contract.wire.experience import ChunkMeta, ChunkReport
    from rlfleet.shared.contract.wire.membership import RegisterRequest
    from rlfleet.shared.infra.http import HttpClient
    from rlfleet.shared.infra.storage import open_storage

    inbox = TaskInbox()
    client = HttpClient(coordinator_url, timeout_s=30, retries=2)
    store = open_storage(storage, namespace)
    reported, pending = 0, []
    try:
        client.post(f"{API}/workers", RegisterRequest(role=Role.COLLECTOR, url=inbox.url,
                                                      worker_id=worker_id))
        task_id = inbox.wait_task("collect")["task_id"]

        def report() -> None:
            client.post(f"{API}/chunks", ChunkReport(worker_id=worker_id, task_id=task_id,
                                                     chunks=pending))
            pending.clear()

        for arrays in chunks:
            chunk_id = uuid.uuid4().hex
            store.put_chunk(chunk_id, encode_arrays(arrays, {"policy_version": "-1",
                                                             "worker_id": worker_id}))
            length = len(next(iter(arrays.values())))
            pending.append(ChunkMeta(chunk_id=chunk_id, length=length, policy_version=-1))
            reported += length
            if len(pending) >= per_report:
                report()
        if pending:
            report()
        client.delete(f"{API}/workers/{worker_id}")
    finally:
        store.close()
        client.close()
        inbox.close()
    return reported


# -- stopping: a bench that is told to stop takes its children with it --------------------

def die_with_parent() -> None:
    """A `preexec_fn` for a bench's child (`rlfleet up`): the kernel sends it SIGTERM when
    the bench dies, however it dies (SIGKILL included), and a launcher that gets SIGTERM
    stops its own children in order. The launcher's own children are set up alike."""
    from rlfleet.local.launcher import _die_with_parent

    _die_with_parent()


def exit_on_signals() -> None:
    """SIGTERM and SIGHUP (a runner's timeout, a closed terminal) end a bench as Ctrl-C does:
    as an exception, so its `finally` blocks stop the clusters it started."""
    def _exit(signum, frame):
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _exit)


# -- processes: waiting on them, stopping them --------------------------------------------

class WaitTimeout(RuntimeError):
    """A condition a bench waited on did not hold in time."""


def wait_for(get: Callable[[], T], timeout_s: float, what: str, interval_s: float = 0.2) -> T:
    """`get()`, polled every `interval_s`, until it returns something true (returned): what
    a bench waits for is another process's state (its HTTP status, a counter), which can be
    asked, not waited on. `get` raises to give up early (a process that exited);
    `WaitTimeout` names `what` past the deadline."""
    deadline = time.monotonic() + timeout_s
    while not (value := get()):
        if time.monotonic() > deadline:
            raise WaitTimeout(f"no {what} after {timeout_s:g} s")
        time.sleep(interval_s)
    return value


def wait_healthy(proc: subprocess.Popen, url: str, what: str, timeout_s: float = 90.0,
                 log_path: Path | None = None) -> None:
    """Until the server `proc` runs answers `url`/health; RuntimeError, with the end of its
    log, if it exits first."""
    import requests

    def healthy() -> bool:
        if proc.poll() is not None:
            tail = f":\n{log_path.read_text(errors='replace')[-2000:]}" if log_path else ""
            raise RuntimeError(f"{what} exited with {proc.returncode}{tail}")
        try:
            return requests.get(f"{url}/health", timeout=2).ok
        except requests.RequestException:
            return False

    wait_for(healthy, timeout_s, f"answer from {what} at {url}/health", interval_s=0.1)


def stop_process(proc: subprocess.Popen, timeout_s: float = 30.0) -> int:
    """SIGTERM (a server drains and exits 0), then SIGKILL if it is still there after
    `timeout_s`; its exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


# -- rlfleet up: a whole run in a subprocess ----------------------------------------------

def up_command(config: Path, run_dir: Path, collectors: int, *options: str) -> list[str]:
    """`rlfleet up` of `config` into `run_dir`, quiet (its summary is read from the run dir),
    with `options` (`--seed`, `--storage`, `--max-wall-s`, ...) added."""
    return [sys.executable, "-m", "rlfleet", "up", "--config", str(config),
            "--collectors", str(collectors), "--run-dir", str(run_dir), *options, "--quiet"]


def start_up(config: Path, run_dir: Path, collectors: int, *options: str,
             log_path: Path | None = None) -> subprocess.Popen:
    """`up_command` started from the repository root, its output in `log_path` (default:
    `up.log` in the run dir); it dies with the bench (`die_with_parent`)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(log_path or run_dir / "up.log", "wb") as out:
        return subprocess.Popen(up_command(config, run_dir, collectors, *options), stdout=out,
                                stderr=subprocess.STDOUT, cwd=REPO_ROOT,
                                preexec_fn=die_with_parent)


@dataclass
class UpRun:
    """What one `rlfleet up` of a bench left: its exit code, `summary.json` (None when it
    wrote none) and its run dir."""

    code: int
    summary: dict | None
    run_dir: Path

    @property
    def outcome(self) -> str:
        return self.summary["outcome"] if self.summary else f"exit {self.code}"

    @cached_property
    def evaluations(self) -> list[tuple[int, float, float]]:
        """The run's deterministic evaluations as (env steps, return, seconds into the run),
        from its metrics (read once, when asked: a bench that times the run need not)."""
        from rlfleet.shared.telemetry.rundata import load_run

        if not (self.run_dir / "metrics.jsonl").exists():
            return []
        run = load_run(self.run_dir)
        key = "eval/deterministic/return_mean"
        if key not in run:
            return []
        steps, values, walls = run.series(key)
        start = min(float(cols["wall_time"].min()) for cols in run.scopes.values())
        return [(int(s), float(v), float(w - start))
                for s, v, w in zip(steps, values, walls, strict=True)]


def run_up(run_dir: Path, config: Path, collectors: int, what: str, *options: str) -> UpRun:
    """`rlfleet up` on `config` into `run_dir` (its output in `up.log` there), waited for and
    read back; `what` names the run in the line logged when it left no summary."""
    with start_up(config, run_dir, collectors, *options) as proc:
        try:
            code = proc.wait()
        except BaseException:  # as `subprocess.call`: a bench told to stop kills its run
            proc.kill()
            raise
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else None
    if summary is None:
        log(f"[red]{what}: rlfleet up exited with {code} and no summary; see "
            f"{run_dir / 'up.log'}[/]")
    return UpRun(code, summary, run_dir)


@dataclass
class Evaluated:
    """One run of a config (`variant`) and a seed, read as its deterministic evaluations: what
    the benches that compare configs by how they learn tabulate."""

    variant: str
    seed: int
    evaluations: list[tuple[int, float, float]] = field(default_factory=list)
    """(env steps, return, seconds into the run) of each evaluation"""
    env_steps: int = 0
    wall_s: float | None = None
    outcome: str = ""

    @classmethod
    def up(cls, variant: str, seed: int, config: Path, collectors: int, run_dir: Path, /,
           **fields: Any) -> Self:
        """`rlfleet up` of `config` into `run_dir` (`run_up`), read back; `fields` are a
        subclass's own (a `run_dir` among them, where it keeps one)."""
        done = run_up(run_dir, config, collectors, f"{variant} seed {seed}")
        run = cls(variant, seed, list(done.evaluations), outcome=done.outcome, **fields)
        if done.summary:
            run.env_steps, run.wall_s = done.summary["env_steps"], done.summary["wall_seconds"]
        return run

    @property
    def best(self) -> float | None:
        return max((r for _, r, _ in self.evaluations), default=None)

    @property
    def last(self) -> float | None:
        return self.evaluations[-1][1] if self.evaluations else None

    def first(self, reached: Callable[[float], bool]) -> tuple[int, float] | None:
        """(env steps, seconds into the run) of the first evaluation whose return `reached`."""
        return next(((s, t) for s, r, t in self.evaluations if reached(r)), None)

    def row(self) -> dict:
        """The run's fields for a bench's JSON, its evaluations left out."""
        return {k: v for k, v in asdict(self).items() if k != "evaluations"}


# -- a local cluster driven step by step --------------------------------------------------

class WorkerFailed(RuntimeError):
    """A worker that exited or reports an error, or a learner group that did not form."""


@dataclass
class LocalRun:
    """A `LocalCluster` whose coordinator answers, and a client of that coordinator: what a
    bench holds that starts, measures and stops workers one at a time."""

    cluster: LocalCluster
    coordinator: Child
    client: HttpClient

    def status(self) -> dict:
        """The coordinator's `/status`: counters, buffer, workers, learner group."""
        from rlfleet.shared.contract.wire.base import API

        return self.client.get(f"{API}/status")

    def counter(self, name: str) -> int:
        return self.status()["counters"][name]

    def buffer_size(self) -> int:
        """Transitions the coordinator's buffers hold."""
        return self.status()["buffer"]["size"]


@contextmanager
def coordinator_up(cluster: LocalCluster) -> Iterator[LocalRun]:
    """`cluster`'s coordinator started and answering, for the block; then the client closed
    and the whole cluster (whatever workers the block left) shut down."""
    from rlfleet.shared.infra.http import HttpClient

    client: HttpClient | None = None
    try:
        coordinator = cluster.start_coordinator()
        client = HttpClient(coordinator.url, timeout_s=10, retries=2)
        yield LocalRun(cluster, coordinator, client)
    finally:
        if client is not None:
            client.close()
        cluster.shutdown()


def worker_status(child: Child, timeout_s: float = 5.0, retries: int = 1) -> dict:
    """A worker's own `/status` (what it says about itself); empty while it does not answer."""
    from rlfleet.shared.infra.http import HttpClient, HttpError

    client = HttpClient(child.url, timeout_s=timeout_s, retries=retries)
    try:
        return client.get("/status")
    except HttpError:
        return {}
    finally:
        client.close()


@dataclass
class Rate:
    """A count over a window, per second of wall time and per CPU-second spent on it (where
    the CPU was counted)."""

    count: float
    seconds: float
    cpu_s: float = 0.0

    @property
    def per_s(self) -> float:
        return self.count / self.seconds

    @property
    def per_cpu_s(self) -> float | None:
        return self.count / self.cpu_s if self.cpu_s > 0 else None


def mean_rate(halves: list[Rate]) -> Rate:
    """Half-windows (a ceiling's, before and after a cluster's window) as one: counts,
    seconds and CPU added up."""
    return Rate(sum(h.count for h in halves), sum(h.seconds for h in halves),
                sum(h.cpu_s for h in halves))


def counter_rate(run: LocalRun, counter: str, seconds: float, cpu: CpuWindow) -> Rate:
    """A coordinator counter's rate over `seconds` of this process's clock; its CPU is what
    the processes `cpu` names used meanwhile, this process's polling left out."""
    s0 = run.counter(counter)
    t0 = time.monotonic()
    cpu.start(t0)
    time.sleep(seconds)
    s1 = run.counter(counter)
    t1 = time.monotonic()
    cpu.stop(t1)
    return Rate(s1 - s0, t1 - t0, sum(v for k, v in cpu.used.items() if k != "bench"))
