"""Soak: a local cluster left training for a long time, sampled for what grows.

A run meant to last a week must not grow: its processes' memory, its storage, its open files
and threads, and the coordinator's answer times must level off once the run is warm. This
script runs `rlfleet up` (CartPole DQN, 4 collectors, Redis storage by default) for
`--minutes`, with a stop value no policy can reach (so it never ends as solved) and an
evaluation every `--eval-every` env steps (so the evaluation history keeps growing), and every
`--interval-s` samples:

- every process of the launcher's tree (psutil, `/proc/PID/smaps_rollup`): PSS and RSS, open
  fds, threads, summed over the tree and per role. PSS is the figure that adds up (a shared
  page counts 1/N in each of the N processes that map it), so the tree's sum is what the
  cluster takes from the machine. Its anonymous part (heap, arenas, tensors: `Pss_Anon`) is
  the leak detector: the file-backed part (libtorch, libpython) also moves when a process
  outside the tree that maps the same libraries starts or exits, and that is not ours;
- the run's storage: on Redis, the number of keys under the run's prefix `rlfleet:<run>:`,
  their bytes (MEMORY USAGE) and the server's used_memory (shared with whatever else uses that
  server); on a directory, its files and bytes. The coordinator's journal (its write-ahead
  records between two snapshots) is counted apart;
- the run directory's bytes: logs, metrics.jsonl, episodes.jsonl and TensorBoard events are
  the run's history and grow with it by design, at a rate a week's disk must hold;
- the coordinator's request latency, p50 and p99 over the last interval, from the
  `rlfleet_http_request_duration_seconds` histogram in its `/metrics`: the difference of the
  cumulative buckets between two scrapes, interpolated linearly inside a bucket. The routes
  that wait on purpose (`/sample` and `/permits/collect` hold a request until data or a
  permit is there) are left out: their time is the rate limiter's, not the coordinator's.

    python -m bench.soak [--minutes 30] [--collectors 4] [--interval-s 15]
                         [--storage redis://127.0.0.1:6379/0 | DIR] [--eval-every 2000]
                         [--short]

Growth is a least-squares slope over the samples after a warm-up (the first 20% of the run,
at least a minute: buffers fill and caches warm first). The run gets a name of its own, so it
never touches another run's keys, and its keys (or its storage directory) are deleted at the
end; its run directory (logs, metrics.jsonl, evaluations.json) is kept in `--work-dir` (by
default a fresh temporary directory). Progress goes to stderr; stdout carries the table of
samples, the figures beside their goals, and as its last line one JSON object (`summarise`):
`minutes`, `pss_mb_start` and `pss_mb_end` (the tree's PSS at the first sample after the
warm-up and at the last), `pss_growth_mb_per_hour` (its slope after the warm-up; goal: under
20), `anon_growth_mb_per_hour` (the same for the anonymous part), `storage_keys_max`,
`fds_growth` and `threads_growth` (last minus first after the warm-up), `p99_ms_start` and
`p99_ms_end` (over the first and the last four intervals after the warm-up), per-role
figures, restarts, and `series` (every sample's figures, for a plot or a test).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import requests
from prometheus_client.parser import text_string_to_metric_families
from rich.table import Table

from bench.common import (
    REPO_ROOT,
    clear_storage,
    fmt,
    is_redis,
    log,
    parse_args,
    report,
    run_main,
    start_up,
    write_yaml,
)
from bench.footprint import ROLES, describe
from rlfleet.cli import free_port

MB = 1024 * 1024
DEFAULT_REDIS = "redis://127.0.0.1:6379/0"
# Goals, printed beside the figures.
GOAL_PSS_GROWTH_MB_PER_H = 20.0
LATENCY_METRIC = "rlfleet_http_request_duration_seconds"
# Routes that hold a request until data or a permit is there: their time is a wait.
WAITING_ROUTES = frozenset({"/api/v1/sample", "/api/v1/permits/collect"})
# The p99 at each end of the run is taken over this many intervals' requests together: one
# interval of a quiet route holds too few requests for a 99th percentile.
END_WINDOW_INTERVALS = 4
# A stop value no policy reaches (CartPole's returns end at 500), so the run never solves.
UNREACHABLE_STOP_VALUE = 1e9
# Beyond the soak, a wall-clock stop the run reaches only if this script could not stop it.
SAFETY_WALL_S = 600.0
FIGURES = ("minutes", "pss_mb_start", "pss_mb_end", "pss_growth_mb_per_hour",
           "anon_growth_mb_per_hour", "rss_mb_end", "storage_keys_max",
           "storage_keys_slope_per_hour", "fds_growth", "threads_growth", "p99_ms_start",
           "p99_ms_end", "samples")
# Half a minute sampled every 2 s after a 6 s warm-up (two end windows of four intervals
# fit after it), one collector: growth figures over seconds say nothing, but each is taken.
SHORT = {"minutes": 0.5, "interval_s": 2.0, "warmup_s": 6.0, "collectors": 1}

Buckets = dict[float, float]  # cumulative count of requests by upper bound (le), +Inf last


# -- the run --------------------------------------------------------------------------------

def soak_config(base: Path, storage: str, minutes: float, eval_every: int) -> dict:
    """The base config as a dict, made to run on and on: evaluations every `eval_every` env
    steps that can never solve the run, and no stop rule but a wall clock well past the soak
    (a safety net should this script die without taking its children down)."""
    from rlfleet.shared.run.config import load_config

    data = load_config(base).model_dump(mode="json")
    data["storage"] = storage
    data["eval"].update(every_env_steps=eval_every, every_train_iterations=None,
                        stop_value=UNREACHABLE_STOP_VALUE)
    data["stop"] = {"max_env_steps": None, "max_train_iterations": None,
                    "max_wall_s": minutes * 60 + SAFETY_WALL_S}
    return data


def auth_headers() -> dict[str, str]:
    """The cluster's token, when one is configured (`shared/infra/auth.py`): the launcher's children
    inherit this environment, so they guard their endpoints with the same token."""
    from rlfleet.shared.infra.auth import load_token

    token = load_token()
    return {"Authorization": f"Bearer {token}"} if token else {}


# -- one sample -----------------------------------------------------------------------------

@dataclass
class StorageSample:
    keys: int            # Redis keys under the run's prefix, or files in its directory
    bytes: int           # their size (Redis: MEMORY USAGE, an estimate that counts overhead)
    journal_keys: int    # journal generations held (Redis lists, or files)
    journal_records: int  # records in them (Redis only: a file's records are not counted)
    journal_bytes: int
    server_used_bytes: int | None = None  # Redis INFO used_memory: the whole server's


@dataclass
class Sample:
    t: float                                   # seconds since `rlfleet up` was launched
    pss_mb: float = 0.0
    rss_mb: float = 0.0
    anon_mb: float = 0.0                       # the anonymous part of PSS
    fds: int = 0
    threads: int = 0
    processes: int = 0
    pss_by_role: dict[str, float] = field(default_factory=dict)
    anon_by_role: dict[str, float] = field(default_factory=dict)
    fds_by_role: dict[str, int] = field(default_factory=dict)
    threads_by_role: dict[str, int] = field(default_factory=dict)
    pids: dict[str, int] = field(default_factory=dict)  # role process name -> pid
    storage: StorageSample | None = None
    latency: dict[str, Buckets] | None = None  # cumulative buckets by "METHOD route"
    p50_ms: float | None = None                # over the interval before this sample
    p99_ms: float | None = None
    requests: float | None = None              # answered in that interval (quick routes)
    env_steps: int | None = None
    workers_listed: int | None = None          # /status's workers (alive or not)
    status_bytes: int | None = None
    run_dir_bytes: int = 0


def smaps_rollup(pid: int) -> dict[str, int]:
    """A process's memory totals in bytes (`Rss`, `Pss`, `Pss_Anon`, ...): one read of
    `/proc/PID/smaps_rollup`, the file psutil's `memory_full_info` reads too."""
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if len(parts) == 3 and parts[2] == "kB":
                out[parts[0].rstrip(":")] = int(parts[1]) * 1024
    return out


def sample_processes(root: psutil.Process, s: Sample) -> None:
    """Add every process of `root`'s tree to `s`: memory, fds, threads, by role. A process
    that is not a role (the learner's data process) counts in its parent's role."""
    try:
        tree = [root, *root.children(recursive=True)]
    except psutil.Error:
        return
    role_of: dict[int, str] = {}
    for p in tree:
        try:
            mem = smaps_rollup(p.pid)
            fds, threads = p.num_fds(), p.num_threads()
            parent = p.parent()
            parent_cmd = parent.cmdline() if parent is not None else None
        except (psutil.Error, OSError):  # exited between the walk and the read
            continue
        role, name = describe(p, parent_cmd)
        if role == "other" and parent is not None and parent.pid in role_of:
            role = role_of[parent.pid]
        elif role in ROLES:
            s.pids[name.removesuffix(" (forked, starting)")] = p.pid
        role_of[p.pid] = role
        pss, anon = mem.get("Pss", 0) / MB, mem.get("Pss_Anon", 0) / MB
        s.pss_mb += pss
        s.rss_mb += mem.get("Rss", 0) / MB
        s.anon_mb += anon
        s.fds += fds
        s.threads += threads
        s.processes += 1
        s.pss_by_role[role] = s.pss_by_role.get(role, 0.0) + pss
        s.anon_by_role[role] = s.anon_by_role.get(role, 0.0) + anon
        s.fds_by_role[role] = s.fds_by_role.get(role, 0) + fds
        s.threads_by_role[role] = s.threads_by_role.get(role, 0) + threads


def redis_storage(client, prefix: str) -> StorageSample:
    """Keys under `prefix` (SCAN: never KEYS, which blocks the server the cluster uses), their
    bytes and the journal's, in pipelined batches."""
    keys = [k.decode() if isinstance(k, bytes) else k
            for k in client.scan_iter(match=f"{prefix}*", count=1000)]
    journal = [k for k in keys if k.startswith(f"{prefix}journal:")]
    sizes: list[int | None] = []
    for i in range(0, len(keys), 1000):
        pipe = client.pipeline(transaction=False)
        for k in keys[i:i + 1000]:
            pipe.memory_usage(k)
        sizes += pipe.execute()
    size_of = dict(zip(keys, sizes, strict=True))
    pipe = client.pipeline(transaction=False)
    for k in journal:
        pipe.llen(k)
    records = sum(pipe.execute()) if journal else 0
    return StorageSample(keys=len(keys), bytes=sum(n or 0 for n in sizes),
                         journal_keys=len(journal), journal_records=records,
                         journal_bytes=sum(size_of[k] or 0 for k in journal),
                         server_used_bytes=int(client.info("memory")["used_memory"]))


def directory_storage(root: Path) -> StorageSample:
    """Files and bytes under the storage directory; the journal is its `journal/` folder."""
    files = size = journal_files = journal_bytes = 0
    for dirpath, _dirs, names in os.walk(root):
        in_journal = Path(dirpath) == root / "journal"
        for name in names:
            try:
                n = os.stat(os.path.join(dirpath, name)).st_size
            except OSError:  # replaced or deleted meanwhile
                continue
            files, size = files + 1, size + n
            if in_journal:
                journal_files, journal_bytes = journal_files + 1, journal_bytes + n
    return StorageSample(keys=files, bytes=size, journal_keys=journal_files,
                         journal_records=0, journal_bytes=journal_bytes)


def tree_bytes(root: Path) -> int:
    """Bytes of the files under `root` (0 if it is not there)."""
    total = 0
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            with contextlib.suppress(OSError):
                total += os.stat(os.path.join(dirpath, name)).st_size
    return total


def parse_latency(text: str) -> dict[str, Buckets]:
    """The latency histogram's cumulative buckets from a `/metrics` text, by
    "METHOD route template"."""
    series: dict[str, Buckets] = {}
    for family in text_string_to_metric_families(text):
        if family.name != LATENCY_METRIC:
            continue
        for s in family.samples:
            if s.name == f"{LATENCY_METRIC}_bucket":
                key = f"{s.labels['method']} {s.labels['endpoint']}"
                series.setdefault(key, {})[float(s.labels["le"])] = s.value
    return series


def bucket_delta(before: Buckets | None, after: Buckets) -> Buckets:
    """Requests between two scrapes of one series. A count that went down means the
    coordinator restarted (its counters start at 0): then all of `after` is new."""
    if before is None or any(after.get(le, 0.0) < n for le, n in before.items()):
        return dict(after)
    return {le: n - before.get(le, 0.0) for le, n in after.items()}


def interval_buckets(before: dict[str, Buckets] | None, after: dict[str, Buckets],
                     skip: Iterable[str] = WAITING_ROUTES) -> Buckets:
    """Requests between two scrapes, all routes but `skip` together."""
    skip = frozenset(skip)
    total: Buckets = {}
    for key, buckets in after.items():
        if key.split(" ", 1)[1] in skip:
            continue
        for le, n in bucket_delta((before or {}).get(key), buckets).items():
            total[le] = total.get(le, 0.0) + n
    return total


def quantile(buckets: Buckets, q: float) -> float | None:
    """The q-quantile (seconds) of cumulative buckets, linear inside the bucket it falls in
    (as Prometheus's histogram_quantile does); None with no request. A quantile past the
    last finite bound is that bound: the histogram cannot say more."""
    items = sorted(buckets.items())
    total = items[-1][1] if items else 0.0
    if total <= 0:
        return None
    rank = q * total
    lower_le, lower_n = 0.0, 0.0
    for le, n in items:
        if n >= rank:
            if math.isinf(le):
                return lower_le
            if n == lower_n:
                return le
            return lower_le + (le - lower_le) * (rank - lower_n) / (n - lower_n)
        lower_le, lower_n = le, n
    return lower_le


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


# -- figures over the run ---------------------------------------------------------------------

def warmup_seconds(minutes: float, fraction: float = 0.2, at_least_s: float = 60.0) -> float:
    """Buffers fill, caches and allocator arenas warm up first: growth before this is not a
    leak. The first `fraction` of the run, at least `at_least_s`."""
    return max(at_least_s, fraction * minutes * 60.0)


def slope_per_hour(ts: Sequence[float], ys: Sequence[float]) -> float | None:
    """Least-squares slope of ys over ts (seconds), per hour; None with fewer than 2 points.
    A fit over every sample, not end minus start: one noisy sample cannot make a trend."""
    if len(ts) < 2:
        return None
    mt, my = sum(ts) / len(ts), sum(ys) / len(ys)
    var = sum((t - mt) ** 2 for t in ts)
    if var == 0:
        return None
    return sum((t - mt) * (y - my) for t, y in zip(ts, ys, strict=True)) / var * 3600.0


def after_warmup(samples: Sequence[Sample], warmup_s: float) -> list[Sample]:
    """The samples the figures are computed on: those after the warm-up, or the second half
    of the run if the warm-up leaves fewer than three (a run shorter than asked)."""
    kept = [s for s in samples if s.t >= warmup_s]
    return kept if len(kept) >= 3 else list(samples[len(samples) // 2:])


def window_quantiles(samples: Sequence[Sample], first: int, last: int
                     ) -> tuple[float | None, float | None, float]:
    """(p50 ms, p99 ms, requests) of the quick routes between samples `first` and `last`."""
    a, b = samples[first].latency, samples[last].latency
    if b is None:
        return None, None, 0.0
    buckets = interval_buckets(a, b)
    n = max(buckets.values(), default=0.0)
    return ms(quantile(buckets, 0.5)), ms(quantile(buckets, 0.99)), n


def slowest_routes(samples: Sequence[Sample], first: int, last: int, top: int = 5
                   ) -> dict[str, dict[str, float]]:
    """The routes with the highest p99 between two samples, waiting ones included (marked):
    where to look when the p99 moves."""
    a, b = samples[first].latency or {}, samples[last].latency or {}
    out = {}
    for key, buckets in b.items():
        delta = bucket_delta(a.get(key), buckets)
        n = max(delta.values(), default=0.0)
        if n > 0:
            out[key] = {"p50_ms": round(ms(quantile(delta, 0.5)) or 0.0, 2),
                        "p99_ms": round(ms(quantile(delta, 0.99)) or 0.0, 2),
                        "requests": int(n), "waits": key.split(" ", 1)[1] in WAITING_ROUTES}
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["p99_ms"])[:top])


def restarts_seen(samples: Sequence[Sample]) -> int:
    """Role processes (by name) whose pid changed between two samples: restarts the
    launcher made, whatever its summary says."""
    changes, last = 0, {}
    for s in samples:
        for name, pid in s.pids.items():
            if name in last and last[name] != pid:
                changes += 1
            last[name] = pid
    return changes


def summarise(samples: Sequence[Sample], warmup_s: float, extra: dict) -> dict:
    """The soak's figures: start and end (after the warm-up), slopes per hour, maxima, and the
    series the figures come from (for a plot, or a test's own check)."""
    warm = after_warmup(samples, warmup_s)
    first, last = warm[0], warm[-1]
    ts = [s.t for s in warm]

    def slope(values: list[float]) -> float | None:
        return slope_per_hour(ts, values)

    def rnd(v: float | None, digits: int = 1) -> float | None:
        return None if v is None else round(v, digits)

    i0 = samples.index(first)
    window = max(1, min(END_WINDOW_INTERVALS, (len(samples) - 1 - i0) // 2))
    p50_start, p99_start, n_start = window_quantiles(samples, i0, min(i0 + window,
                                                                      len(samples) - 1))
    p50_end, p99_end, n_end = window_quantiles(samples, len(samples) - 1 - window,
                                               len(samples) - 1)
    stored = [s.storage for s in samples if s.storage is not None]
    stored_warm = [s for s in warm if s.storage is not None]
    used = [st.server_used_bytes for st in stored if st.server_used_bytes is not None]
    roles = sorted({r for s in samples for r in s.pss_by_role},
                   key=lambda r: ROLES.index(r) if r in ROLES else len(ROLES))
    span = samples[-1].t - samples[0].t if len(samples) > 1 else 0.0
    return {
        "minutes": round(samples[-1].t / 60.0, 2),
        "pss_mb_start": rnd(first.pss_mb),
        "pss_mb_end": rnd(last.pss_mb),
        "pss_growth_mb_per_hour": rnd(slope([s.pss_mb for s in warm])),
        "storage_keys_max": max((st.keys for st in stored), default=None),
        "fds_growth": last.fds - first.fds,
        "p99_ms_start": rnd(p99_start, 2),
        "p99_ms_end": rnd(p99_end, 2),
        "p50_ms_start": rnd(p50_start, 2),
        "p50_ms_end": rnd(p50_end, 2),
        "latency_requests_start": int(n_start),
        "latency_requests_end": int(n_end),
        "slowest_routes": slowest_routes(samples, i0, len(samples) - 1),
        "pss_mb_by_role_end": {r: rnd(last.pss_by_role.get(r, 0.0)) for r in roles},
        "pss_growth_mb_per_hour_by_role": {
            r: rnd(slope([s.pss_by_role.get(r, 0.0) for s in warm])) for r in roles},
        "anon_pss_mb_start": rnd(first.anon_mb),
        "anon_pss_mb_end": rnd(last.anon_mb),
        "anon_growth_mb_per_hour": rnd(slope([s.anon_mb for s in warm])),
        "anon_growth_mb_per_hour_by_role": {
            r: rnd(slope([s.anon_by_role.get(r, 0.0) for s in warm])) for r in roles},
        "rss_mb_end": rnd(last.rss_mb),
        "rss_growth_mb_per_hour": rnd(slope([s.rss_mb for s in warm])),
        "fds_start": first.fds,
        "fds_end": last.fds,
        "threads_start": first.threads,
        "threads_end": last.threads,
        "threads_growth": last.threads - first.threads,
        "processes_min": min(s.processes for s in samples),
        "processes_max": max(s.processes for s in samples),
        "storage_keys_end": stored[-1].keys if stored else None,
        "storage_keys_slope_per_hour": (
            rnd(slope_per_hour([s.t for s in stored_warm],
                               [s.storage.keys for s in stored_warm]))
            if stored_warm else None),
        "storage_mb_max": rnd(max((st.bytes for st in stored), default=0) / MB, 2),
        "storage_mb_end": rnd(stored[-1].bytes / MB, 2) if stored else None,
        "journal_keys_max": max((st.journal_keys for st in stored), default=None),
        "journal_records_max": max((st.journal_records for st in stored), default=None),
        "journal_mb_max": rnd(max((st.journal_bytes for st in stored), default=0) / MB, 3),
        "redis_used_memory_mb_max": rnd(max(used) / MB) if used else None,
        "env_steps_end": last.env_steps,
        "run_dir_mb_end": rnd(last.run_dir_bytes / MB, 2),
        "run_dir_growth_mb_per_hour": rnd(slope([s.run_dir_bytes / MB for s in warm])),
        "status_kb_start": rnd((first.status_bytes or 0) / 1024, 2),
        "status_kb_end": rnd((last.status_bytes or 0) / 1024, 2),
        "workers_listed_end": last.workers_listed,
        "pid_changes": restarts_seen(samples),
        "samples": len(samples),
        "samples_after_warmup": len(warm),
        "interval_s": round(span / max(1, len(samples) - 1), 2),
        "warmup_s": round(warmup_s, 1),
        **extra,
        "goals": {"pss_growth_mb_per_hour": f"< {GOAL_PSS_GROWTH_MB_PER_H:g}",
                  "storage_keys": "bounded", "fds": "bounded", "p99_ms": "flat"},
        "series": {
            "t_s": [round(s.t, 1) for s in samples],
            "pss_mb": [rnd(s.pss_mb) for s in samples],
            "anon_mb": [rnd(s.anon_mb) for s in samples],
            "anon_mb_by_role": {r: [rnd(s.anon_by_role.get(r, 0.0)) for s in samples]
                                for r in roles},
            "coordinator_pss_mb": [rnd(s.pss_by_role.get("coordinator", 0.0))
                                   for s in samples],
            "rss_mb": [rnd(s.rss_mb) for s in samples],
            "fds": [s.fds for s in samples],
            "threads": [s.threads for s in samples],
            "processes": [s.processes for s in samples],
            "storage_keys": [s.storage.keys if s.storage else None for s in samples],
            "p99_ms": [rnd(s.p99_ms, 2) for s in samples],
        },
    }


# -- running and sampling ---------------------------------------------------------------------

class Soak:
    """`rlfleet up` as a child, and what is read from it at each sample."""

    def __init__(self, run_dir: Path, storage: str, port: int) -> None:
        self.run_dir = run_dir
        self.storage = storage
        self.namespace = run_dir.name[:64]  # `rlfleet up` names the run after its directory
        self.url = f"http://127.0.0.1:{port}"
        self.http = requests.Session()
        self.http.headers.update(auth_headers())
        self.redis = None
        if is_redis(storage):
            import redis

            self.redis = redis.Redis.from_url(storage, socket_timeout=10)
        self.proc: subprocess.Popen | None = None
        self.t0 = time.monotonic()
        self.samples: list[Sample] = []

    def start(self, config: Path, collectors: int, port: int) -> None:
        self.t0 = time.monotonic()
        self.proc = start_up(config, self.run_dir, collectors, "--storage", self.storage,
                             "--port", str(port))

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self, timeout_s: float = 180.0) -> bool:
        """Until the coordinator answers and a chunk has arrived (every role is up)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.alive():
            try:
                status = self.http.get(f"{self.url}/api/v1/status", timeout=5).json()
                if status["counters"]["env_steps"] > 0:
                    return True
            except (requests.RequestException, ValueError, KeyError):
                pass
            time.sleep(0.5)
        return False

    def sample(self) -> Sample:
        assert self.proc is not None
        s = Sample(t=time.monotonic() - self.t0)
        with contextlib.suppress(psutil.Error):  # the launcher is gone: no processes
            sample_processes(psutil.Process(self.proc.pid), s)
        s.storage = self._storage()
        s.run_dir_bytes = tree_bytes(self.run_dir)
        try:
            text = self.http.get(f"{self.url}/metrics", timeout=10).text
            s.latency = parse_latency(text)
            resp = self.http.get(f"{self.url}/api/v1/status", timeout=10)
            status = resp.json()
            s.status_bytes = len(resp.content)
            s.env_steps = status["counters"]["env_steps"]
            s.workers_listed = len(status["workers"])
        except (requests.RequestException, ValueError, KeyError) as err:
            log(f"[yellow]coordinator not read at {s.t:.0f} s: {err}[/]")
        before = self.samples[-1].latency if self.samples else None
        if s.latency is not None and before is not None:
            buckets = interval_buckets(before, s.latency)
            s.p50_ms, s.p99_ms = ms(quantile(buckets, 0.5)), ms(quantile(buckets, 0.99))
            s.requests = max(buckets.values(), default=0.0)
        self.samples.append(s)
        return s

    def _storage(self) -> StorageSample | None:
        try:
            if self.redis is not None:
                return redis_storage(self.redis, f"rlfleet:{self.namespace}:")
            return directory_storage(Path(self.storage.removeprefix("file://")))
        except Exception as err:  # a figure missing from one sample, said, not fatal
            log(f"[yellow]storage not read: {type(err).__name__}: {err}[/]")
            return None

    def stop(self, timeout_s: float = 120.0) -> int | None:
        """SIGINT, as Ctrl-C: the launcher stops its children in order and writes its
        summary; SIGKILL if it does not (its children then get SIGTERM from the kernel)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                log("[red]rlfleet up did not stop in time: killed[/]")
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def close(self) -> None:
        self.http.close()
        if self.redis is not None:
            self.redis.close()


def soak(soak_: Soak, minutes: float, interval_s: float) -> bool:
    """Sample every `interval_s` until `minutes` after the launch; whether the launcher was
    still running at the end (it never ends by itself before the safety wall clock)."""
    deadline = soak_.t0 + minutes * 60.0
    next_at = time.monotonic()
    while time.monotonic() < deadline:
        if not soak_.alive():
            log(f"[red]rlfleet up exited early with {soak_.proc.returncode}; see "
                f"{soak_.run_dir / 'up.log'}[/]")
            return False
        s = soak_.sample()
        log(f"{s.t:6.0f} s  PSS {s.pss_mb:7.1f} MB  fds {s.fds:4d}  threads {s.threads:4d}  "
            f"keys {fmt(s.storage.keys if s.storage else None, 'd')}  "
            f"p99 {fmt(s.p99_ms, '.2f', ' ms')}  env steps {fmt(s.env_steps, ',')}")
        next_at += interval_s
        time.sleep(max(0.0, min(next_at, deadline) - time.monotonic()))
    if not soak_.alive():
        return False
    soak_.sample()  # the last one at the deadline, so the figures span the whole run
    return True


# -- output ---------------------------------------------------------------------------------

def tables(samples: Sequence[Sample], result: dict) -> list[Table]:
    per = Table(title=f"soak samples (every {result['interval_s']:g} s; memory in MB, PSS "
                      "unless said; latency of the coordinator's quick routes over the "
                      "interval)")
    columns = ("t s", "PSS", "anon", "coord", "learner", "collectors", "RSS", "fds", "threads",
               "keys", "storage MB", "journal", "p50 ms", "p99 ms", "env steps")
    for name in columns:
        per.add_column(name, justify="right")
    for s in samples:
        st = s.storage
        per.add_row(
            f"{s.t:.0f}", fmt(s.pss_mb), fmt(s.anon_mb), fmt(s.pss_by_role.get("coordinator")),
            fmt(s.pss_by_role.get("learner")), fmt(s.pss_by_role.get("collector")),
            fmt(s.rss_mb), str(s.fds), str(s.threads), fmt(st.keys if st else None, "d"),
            fmt(st.bytes / MB if st else None, ".2f"),
            fmt(st.journal_records if st and st.journal_records else
                (st.journal_keys if st else None), "d"),
            fmt(s.p50_ms, ".2f"), fmt(s.p99_ms, ".2f"), fmt(s.env_steps, ","),
            style="dim" if s.t < result["warmup_s"] else None)

    figures = Table(title=f"soak: {result['minutes']:.1f} min, {result['collectors']} "
                          f"collectors, {result['storage']} storage (after a "
                          f"{result['warmup_s']:.0f} s warm-up)")
    for name in ("figure", "start", "end", "growth", "goal"):
        figures.add_column(name, justify="left" if name in ("figure", "goal") else "right")
    r = result
    figures.add_row("PSS, whole tree (MB)", fmt(r["pss_mb_start"]), fmt(r["pss_mb_end"]),
                    fmt(r["pss_growth_mb_per_hour"], "+.1f", " MB/h"),
                    f"< {GOAL_PSS_GROWTH_MB_PER_H:g} MB/h", style="bold")
    for role, mb in r["pss_mb_by_role_end"].items():
        figures.add_row(f"  PSS, {role}", "", fmt(mb),
                        fmt(r["pss_growth_mb_per_hour_by_role"][role], "+.1f", " MB/h"), "")
    figures.add_row("PSS, anonymous part (MB)", fmt(r["anon_pss_mb_start"]),
                    fmt(r["anon_pss_mb_end"]), fmt(r["anon_growth_mb_per_hour"], "+.1f",
                                                   " MB/h"), "(a leak shows here)")
    for role, growth in r["anon_growth_mb_per_hour_by_role"].items():
        figures.add_row(f"  anonymous, {role}", "", "", fmt(growth, "+.1f", " MB/h"), "")
    figures.add_row("RSS, whole tree (MB)", "", fmt(r["rss_mb_end"]),
                    fmt(r["rss_growth_mb_per_hour"], "+.1f", " MB/h"), "")
    figures.add_row("open fds", str(r["fds_start"]), str(r["fds_end"]),
                    f"{r['fds_growth']:+d}", "bounded", style="bold")
    figures.add_row("threads", str(r["threads_start"]), str(r["threads_end"]),
                    f"{r['threads_growth']:+d}", "bounded")
    figures.add_row("storage keys (max / end)", fmt(r["storage_keys_max"], "d"),
                    fmt(r["storage_keys_end"], "d"),
                    fmt(r["storage_keys_slope_per_hour"], "+.0f", " /h"), "bounded",
                    style="bold")
    figures.add_row("storage MB (max / end)", fmt(r["storage_mb_max"], ".2f"),
                    fmt(r["storage_mb_end"], ".2f"), "", "bounded")
    figures.add_row("journal (max keys, records, MB)", fmt(r["journal_keys_max"], "d"),
                    f"{fmt(r['journal_records_max'], 'd')} rec, "
                    f"{fmt(r['journal_mb_max'], '.3f')} MB", "", "bounded")
    figures.add_row("coordinator p50 (ms)", fmt(r["p50_ms_start"], ".2f"),
                    fmt(r["p50_ms_end"], ".2f"), "", "flat")
    figures.add_row("coordinator p99 (ms)", fmt(r["p99_ms_start"], ".2f"),
                    fmt(r["p99_ms_end"], ".2f"), "", "flat", style="bold")
    figures.add_row("run directory (MB): logs, metrics, episodes", "",
                    fmt(r["run_dir_mb_end"], ".1f"),
                    fmt(r["run_dir_growth_mb_per_hour"], "+.1f", " MB/h"), "disk for the run")
    figures.add_row("/status answer (KB)", fmt(r["status_kb_start"], ".2f"),
                    fmt(r["status_kb_end"], ".2f"), "", "bounded")
    figures.add_row("evaluations held by the coordinator (of all)", "",
                    f"{fmt(r['evaluations'], 'd')} (of {fmt(r['evaluations_reported'], 'd')})",
                    "", "bounded window")
    figures.add_row("processes (min / max)", str(r["processes_min"]),
                    str(r["processes_max"]), "", "constant")
    figures.add_row("restarts (launcher / pids seen)", str(r["restarts"]),
                    str(r["pid_changes"]), "", "0")
    figures.add_row("run", f"{r['outcome']}", f"{fmt(r['env_steps_end'], ',')} env steps",
                    "", "running to the end")
    return [per, figures]


def _evaluations(run_dir: Path) -> tuple[int | None, int | None]:
    """(held, reported): the evaluations the coordinator still held when the launcher saved
    its history (`<run-dir>/evaluations.json`), and how many the run had (the last `seq`)."""
    try:
        held = json.loads((run_dir / "evaluations.json").read_text())
    except (OSError, ValueError):
        return None, None
    return len(held), (held[-1].get("seq") if held else 0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", type=Path, default=REPO_ROOT / "configs" / "cartpole-dqn.yaml")
    p.add_argument("--minutes", type=float, default=30.0, help="length of the soak")
    p.add_argument("--collectors", type=int, default=4)
    p.add_argument("--interval-s", type=float, default=15.0, help="between two samples")
    p.add_argument("--storage", default=DEFAULT_REDIS,
                   help="redis://host:port/db (keys under the run's own prefix) or a "
                        "directory (the run's storage goes in a fresh folder inside)")
    p.add_argument("--eval-every", type=int, default=2000,
                   help="env steps between two evaluations (default 2000)")
    p.add_argument("--warmup-s", type=float, default=None,
                   help="left out of the growth figures (default: 20%% of the run, >= 60 s)")
    p.add_argument("--work-dir", type=Path, default=None,
                   help="where the run dir goes (default: a fresh temporary directory, kept)")
    args = parse_args(p, argv, SHORT)

    work = (args.work_dir or Path(tempfile.mkdtemp(prefix="rlfleet-soak-"))).resolve()
    name = f"soak-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}"
    run_dir = work / name
    storage = args.storage
    if not is_redis(storage):  # never another run's files: a folder of its own, deleted after
        storage = str(Path(storage.removeprefix("file://")).resolve() / name)
    work.mkdir(parents=True, exist_ok=True)
    config = write_yaml(work / f"{name}.yaml", soak_config(args.config.resolve(), storage,
                                                            args.minutes, args.eval_every))
    port = free_port()
    warmup_s = args.warmup_s if args.warmup_s is not None else warmup_seconds(args.minutes)
    runner = Soak(run_dir, storage, port)
    if runner.redis is not None:
        clear_storage(storage, runner.namespace)  # nothing of a former run of this name
    log(f"rlfleet up {args.config.name}, {args.collectors} collectors, storage {storage}, "
        f"coordinator {runner.url}, {args.minutes:g} min sampled every {args.interval_s:g} s; "
        f"run dir {run_dir}")
    alive_at_end, code, keys_left = False, None, None
    try:
        runner.start(config, args.collectors, port)
        if runner.wait_ready():
            alive_at_end = soak(runner, args.minutes, args.interval_s)
        else:
            log(f"[red]the cluster did not start; see {run_dir / 'up.log'}[/]")
    finally:
        code = runner.stop()
        runner.close()
        clear_storage(storage, runner.namespace)
        if runner.redis is not None:
            import redis

            client = redis.Redis.from_url(storage)
            keys_left = sum(1 for _ in client.scan_iter(match=f"rlfleet:{runner.namespace}:*"))
            client.close()
        else:
            keys_left = int(Path(storage).exists())
    samples = runner.samples
    if len(samples) < 2:
        log(f"[red]{len(samples)} samples: nothing to summarise; see {run_dir / 'up.log'}[/]")
        return 1
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    held, reported = _evaluations(run_dir)
    result = summarise(samples, warmup_s, {
        "minutes_asked": args.minutes,
        "collectors": args.collectors,
        "storage": "redis" if runner.redis is not None else "directory",
        "eval_every_env_steps": args.eval_every,
        "evaluations": held,
        "evaluations_reported": reported,
        "launcher_alive_at_end": alive_at_end,
        "launcher_exit_code": code,
        "outcome": summary.get("outcome", f"exit {code}"),
        "restarts": sum((summary.get("restarts") or {}).values()),
        "storage_keys_left": keys_left,
        "run_dir": str(run_dir),
    })
    log(f"PSS {result['pss_mb_start']} -> {result['pss_mb_end']} MB "
        f"({result['pss_growth_mb_per_hour']} MB/h), keys max {result['storage_keys_max']}, "
        f"fds {result['fds_growth']:+d}, p99 {result['p99_ms_start']} -> "
        f"{result['p99_ms_end']} ms")
    report(result, *tables(samples, result))
    return 0 if alive_at_end else 1


if __name__ == "__main__":
    run_main(main)
