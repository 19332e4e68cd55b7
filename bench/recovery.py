"""Seconds a running cluster takes to get back to its throughput after one process is killed.

The cluster is `rlfleet up` (a subprocess, supervising its children: `--max-restarts`) on the
free-running config of `bench/common.py` (no replay-ratio throttling, no evaluations, no stop
rule but a long `max_wall_s`, a constant epsilon), with `--collectors` collectors and Redis
storage on the bench's own `redis-server` on a free port (`--save "" --appendonly yes
--appendfsync always`: every acknowledged write is on disk, so a killed Redis loses nothing).

For each role in turn (`--roles`, default collector, learner, coordinator, redis):

1. Baseline: env steps/s and train iterations/s from the coordinator's counters
   (`GET /api/v1/status`) over `--baseline-s`, the cluster whole. This is the ceiling each
   figure is printed beside; it is measured again before every role, so a cluster that
   drifted (the replay buffer filling, a neighbour's load) is compared with itself.
2. SIGKILL, with no warning: a collector (`collector-1`), the learner or the coordinator, each
   with its whole process group, as the OOM killer or a lost node would; or `redis-server`,
   which the bench then starts again at once on the same port with the same directory (what
   an orchestrator does; the launcher supervises rlfleet's processes, not Redis).
3. Recovery: the time from the kill until the role is back (the worker registered again
   under its id; the coordinator answers /status; Redis answers PING) and, after that, the
   cluster's env steps/s are back at >= `--threshold` (90%) of the baseline, sustained for
   1 s: the counters are sampled every 0.1 s, and the recovery is the start of the first
   1 s window, after the role is back, whose rate is above the threshold. Env steps/s in a
   window are the median of its 0.1 s intervals' rates, not their mean: a restarted
   coordinator is sent at once what the collectors held while it was down (work done during
   the outage, not the cluster being back), and that burst would carry a mean over the
   line. The baseline is measured alike.
   For the learner, train iterations/s must be back at >= 90% of their baseline too: killing
   the learner frees a core, so env steps/s hardly drop (collectors go on with the policy
   they hold) and would call it recovered while it is still importing torch; what the
   learner is there for is training. Its recovery includes redoing the iterations since its
   last checkpoint, which the coordinator's counter (the highest it was told) does not count.
   A role that is not back within `--timeout-s` reports null, and the bench says so.

Rates only use samples taken after the role was back: a restarted coordinator's counters
start again from its snapshot, so a window across the restart is meaningless. "Steady" is the
share of the baseline's own 1 s windows that were above the threshold: on a busy two-core
machine about one in four falls below 90% with nothing killed, so a recovery figure is
uncertain by a second or so.

    python -m bench.recovery [--roles collector learner coordinator redis] [--timeout-s 90]
                             [--collectors 2] [--baseline-s 5] [--short]

The last line of stdout is one JSON object: the figures per role (`FIGURES`), with `notes`
where a role did not recover and `error` (only then) where the bench could not measure.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import redis
import yaml
from rich.table import Table

from bench.common import (
    REPO_ROOT,
    child_pids,
    die_with_parent,
    fmt,
    free_running_data,
    log,
    parse_args,
    progress,
    ratio,
    report,
    rounded,
    run_main,
    start_up,
    wait_for,
    write_yaml,
)
from rlfleet.cli import free_port
from rlfleet.local.forking import role_in
from rlfleet.shared.contract.wire.base import API
from rlfleet.shared.infra.http import HttpClient, HttpError

ROLES = ("collector", "learner", "coordinator", "redis")
# Each is one value per role killed (`--roles`).
FIGURES = ("recovery_s", "role_back_s", "baseline_env_steps_per_s", "env_steps_per_s_after",
           "baseline_train_iterations_per_s", "train_iterations_per_s_after",
           "baseline_steady")
# Every role still killed, with one collector (a faster start), a 1.5 s baseline (a few
# 1 s windows, for `baseline_steady`), a checkpoint every 500 train iterations (what a
# restarted learner redoes) and recovered at 30% of the baseline: on a busy two-core machine
# a quarter of the baseline's own windows fall below 90%, waiting for one above it took up
# to half a minute a role, and waiting for one above half of it still took seconds after the
# role was back and working (env steps/s swing widely right after a restart).
SHORT = {"collectors": 1, "baseline_s": 1.5, "timeout_s": 60.0, "checkpoint_every": 500,
         "threshold": 0.3}
RATE_WINDOW_S = 1.0  # "sustained for 1 s": a rate is measured over a whole second
SAMPLE_S = 0.1


# -- processes ------------------------------------------------------------------------------

class RedisServer:
    """The bench's own redis-server: every write fsynced before it is acknowledged."""

    def __init__(self, work: Path) -> None:
        self.dir = work / "redis"
        self.dir.mkdir()
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 30.0) -> None:
        cmd = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
               "--save", "", "--appendonly", "yes", "--appendfsync", "always",
               "--dir", str(self.dir), "--logfile", str(self.dir / "redis.log")]
        self.proc = subprocess.Popen(cmd, preexec_fn=die_with_parent)

        def answers() -> bool:
            if self.proc is None or self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited; see {self.dir}/redis.log")
            return self.answers()

        wait_for(answers, timeout_s, f"answer from redis-server (see {self.dir}/redis.log)",
                 interval_s=0.05)

    def answers(self) -> bool:
        """PING answered (not while it is still loading its append-only file)."""
        client = redis.Redis(port=self.port, socket_timeout=1, socket_connect_timeout=1)
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)


def _cmdline(pid: int) -> list[str]:
    """A process's command line as words. An exec'd child's is its argv (`python -m rlfleet
    <role> ...`); a forked child's is the title setproctitle wrote over the launcher's argv
    (`rlfleet <role> ...`), one string padded with NULs, so it is split on spaces."""
    try:
        args = [a for a in Path(f"/proc/{pid}/cmdline").read_bytes().decode(
            errors="replace").split("\0") if a]
    except OSError:
        return []
    return args[0].split() if len(args) == 1 else args


def _option(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args[:-1] else None


class Up:
    """`rlfleet up` as a subprocess; its children found through /proc."""

    def __init__(self, config: Path, run_dir: Path, collectors: int, storage: str) -> None:
        self.run_dir = run_dir
        self.log_path = run_dir.parent / "up.log"
        # Dies with the bench (it then stops its own children in order).
        self.proc = start_up(config, run_dir, collectors, "--storage", storage,
                             log_path=self.log_path)

    def child(self, role: str, worker_id: str | None = None) -> int | None:
        """The pid of the launcher's child running `role` (with `--worker-id worker_id`):
        forked at the start (titled `rlfleet <role> ...`) or exec'd by a restart (`python -m
        rlfleet <role> ...`); `role_in` reads both. The launcher puts `--port` and
        `--worker-id` first, so a title cut to the launcher's length still names them."""
        for pid in child_pids(self.proc.pid):
            args = _cmdline(pid)
            if role_in(args) == role and (worker_id is None
                                          or _option(args, "--worker-id") == worker_id):
                return pid
        return None

    def coordinator_url(self) -> str | None:
        pid = self.child("coordinator")
        port = _option(_cmdline(pid), "--port") if pid else None
        return f"http://127.0.0.1:{port}" if port else None

    def output(self, lines: int = 20) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self, url: str | None) -> int | None:
        """Ask the run to stop, then wait for the launcher; SIGINT, then SIGKILL, if it hangs."""
        if url and self.proc.poll() is None:
            client = HttpClient(url, timeout_s=5, retries=2)
            with contextlib.suppress(HttpError):
                client.post(f"{API}/run/stop")
            client.close()
        for sig, wait_s in ((None, 60), (signal.SIGINT, 40), (signal.SIGKILL, 10)):
            if sig is not None:
                self.proc.send_signal(sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                return self.proc.wait(wait_s)
        return None


# -- measuring ------------------------------------------------------------------------------

@dataclass
class Sample:
    t: float
    env_steps: int
    train_iterations: int


@dataclass
class Rates:
    env_steps: float
    train_iterations: float

    @staticmethod
    def over(samples: list[Sample]) -> Rates:
        """Rates over consecutive samples. Env steps/s are the median of the intervals' rates,
        not the mean: a restarted coordinator is sent at once what the collectors held while
        it was down (work done during the outage), and one or two such bursts must not make
        a window look recovered. Train iterations/s are the mean: the learner reports in
        steps of tens of iterations every 0.1 s, too coarse for a median of 0.1 s intervals,
        and a restarted learner catches up on the coordinator's counter without a burst
        (the counter is the highest iteration reported)."""
        a, b = samples[0], samples[-1]
        env = statistics.median((y.env_steps - x.env_steps) / (y.t - x.t)
                                for x, y in itertools.pairwise(samples))
        return Rates(env, (b.train_iterations - a.train_iterations) / (b.t - a.t))

    def meets(self, base: Rates, threshold: float, train_too: bool) -> bool:
        return self.env_steps >= threshold * base.env_steps and (
            not train_too or self.train_iterations >= threshold * base.train_iterations)


def trailing(samples: list[Sample], window_s: float = RATE_WINDOW_S
             ) -> list[tuple[int, Rates]]:
    """(index of its first sample, rates) for each trailing window: from each sample back to
    the newest sample at least `window_s` older (samples with less history have none)."""
    out, j = [], 0
    for i, b in enumerate(samples):
        while j + 1 < i and samples[j + 1].t <= b.t - window_s:
            j += 1
        if samples[j].t <= b.t - window_s:
            out.append((j, Rates.over(samples[j:i + 1])))
    return out


def first_back(samples: list[Sample], base: Rates, threshold: float,
               train_too: bool) -> tuple[float, Rates] | None:
    """The first trailing window whose rates are back at `threshold` of `base`: when it
    started, and its rates. None if there is none yet."""
    for first, rates in trailing(samples):
        if rates.meets(base, threshold, train_too):
            return samples[first].t, rates
    return None


class Meter:
    """The coordinator's counters, sampled."""

    def __init__(self, url: str) -> None:
        self.client = HttpClient(url, timeout_s=2, retries=0)
        self.samples: list[Sample] = []

    def status(self) -> dict | None:
        try:
            return self.client.get(f"{API}/status")
        except HttpError:
            return None

    def sample(self) -> dict | None:
        """One status read, kept as a sample; None while the coordinator does not answer."""
        status = self.status()
        if status is not None:
            c = status["counters"]
            self.samples.append(Sample(time.monotonic(), c["env_steps"], c["train_iterations"]))
        return status

    def close(self) -> None:
        self.client.close()


def wait_working(meter: Meter, collectors: int, timeout_s: float) -> None:
    """Until every collector and the learner are alive and the learner trains."""
    def working() -> bool:
        status = meter.status()
        if status is None:
            return False
        alive = [w for w in status["workers"] if w["state"] == "alive"]
        return (sum(w["role"] == "collector" for w in alive) >= collectors
                and any(w["role"] == "learner" for w in alive)
                and status["counters"]["train_iterations"] > 0)

    wait_for(working, timeout_s, "cluster training (every worker alive, the learner training)",
             interval_s=0.25)


@dataclass
class Baseline:
    rates: Rates
    steady: float          # share of its trailing windows at or above the threshold


def measure_baseline(meter: Meter, seconds: float, threshold: float,
                     train_too: bool) -> Baseline:
    """The whole cluster's rates over `seconds`, and how the recovery test fares on them."""
    meter.samples.clear()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if meter.sample() is None:
            raise RuntimeError("the coordinator stopped answering during the baseline")
        time.sleep(SAMPLE_S)
    samples = meter.samples
    base = Rates.over(samples)
    windows = [r for _, r in trailing(samples)]
    steady = sum(r.meets(base, threshold, train_too) for r in windows) / max(1, len(windows))
    return Baseline(base, steady)


# -- one role -------------------------------------------------------------------------------

@dataclass
class Result:
    role: str
    baseline: Baseline
    back_s: float | None = None        # kill -> the role itself is back
    recovery_s: float | None = None    # kill -> throughput back (start of that 1 s window)
    after: Rates | None = None         # rates over that window
    note: str = ""


@dataclass
class Target:
    """How to kill one role and how to tell it is back."""
    kill: Callable[[], None]
    back: Callable[[dict | None], bool]   # given the latest status (None: no answer)
    train_too: bool = False               # train iterations/s must recover as well


def _registrations(status: dict | None, worker_id: str) -> int:
    for w in (status or {}).get("workers", []):
        if w["worker_id"] == worker_id:
            return w["registrations"] if w["state"] == "alive" else 0
    return 0


def _kill_group(pid: int | None, what: str) -> None:
    if pid is None:
        raise RuntimeError(f"no {what} process to kill")
    os.killpg(pid, signal.SIGKILL)  # the launcher gives each child its own session


def target(role: str, up: Up, redis_server: RedisServer, before: dict) -> Target:
    if role in ("collector", "learner"):
        worker_id = "collector-1" if role == "collector" else "learner"
        registered = _registrations(before, worker_id)
        return Target(lambda: _kill_group(up.child(role, worker_id), worker_id),
                      lambda s: _registrations(s, worker_id) > registered,
                      train_too=role == "learner")
    if role == "coordinator":
        return Target(lambda: _kill_group(up.child("coordinator"), "coordinator"),
                      lambda s: s is not None)

    def kill_redis() -> None:
        redis_server.kill()
        redis_server.start()

    return Target(kill_redis, lambda s: redis_server.answers())


def recover(role: str, up: Up, meter: Meter, redis_server: RedisServer, base: Baseline,
            threshold: float, timeout_s: float) -> Result:
    """Kill `role`, then sample until the cluster is back to `threshold` of `base`."""
    result = Result(role, base)
    how = target(role, up, redis_server, meter.status() or {})
    t_kill = time.monotonic()
    how.kill()
    meter.samples.clear()
    while (now := time.monotonic()) - t_kill < timeout_s:
        if up.proc.poll() is not None:
            result.note = f"rlfleet up exited with {up.proc.returncode}"
            return result
        status = meter.sample()
        if result.back_s is None:
            if not how.back(status):
                meter.samples.clear()  # rates only from the role's return on
                time.sleep(SAMPLE_S)
                continue
            result.back_s = now - t_kill
        found = first_back(meter.samples, base.rates, threshold, how.train_too)
        if found is not None:
            result.recovery_s, result.after = found[0] - t_kill, found[1]
            return result
        time.sleep(SAMPLE_S)
    result.note = ("not back" if result.back_s is None else "throughput not back") + \
        f" within {timeout_s:g} s"
    return result


# -- output -----------------------------------------------------------------------------------

def report_table(results: list[Result], threshold: float, collectors: int) -> Table:
    t = Table(title=f"recovery after SIGKILL: rlfleet up with {collectors} collectors, Redis "
                    "storage (appendfsync always)",
              caption=f"recovered: kill -> start of the first {RATE_WINDOW_S:g} s window, "
                      "once the role was back (role back: registered again, or answering), "
                      f"over which env steps/s (for the learner, train iterations/s too) were "
                      f">= {threshold:.0%} of the baseline; env steps/s: the median of the "
                      "window's 0.1 s intervals (a burst of late reports does not count). "
                      "Baseline: the whole cluster just before the kill, the ceiling. Steady: "
                      "the share of the baseline's own 1 s windows above the threshold (how "
                      "noisy the machine is).")
    for name in ("role", "role back", "recovered", "baseline env/s", "after env/s", "ratio",
                 "baseline train it/s", "after train it/s", "steady", "note"):
        t.add_column(name, justify="left" if name in ("role", "note") else "right")
    for r in results:
        b, a = r.baseline.rates, r.after
        t.add_row(r.role, fmt(r.back_s, ".1f", " s"), fmt(r.recovery_s, ".1f", " s"),
                  fmt(b.env_steps, ",.0f"), fmt(a and a.env_steps, ",.0f"),
                  fmt(ratio(a and a.env_steps, b.env_steps), ".2f"),
                  fmt(b.train_iterations, ",.0f"), fmt(a and a.train_iterations, ",.0f"),
                  fmt(r.baseline.steady, ".0%"), r.note)
    return t


def bench_config(base: Path, work: Path, storage: str, args: argparse.Namespace) -> Path:
    data = free_running_data(base, f"bench-recovery-{os.getpid()}", storage, args.epsilon)
    data["stop"]["max_wall_s"] = args.max_wall_s  # a safety net: the bench stops the run
    data["coordinator"]["snapshot_interval_s"] = args.snapshot_interval_s
    if args.checkpoint_every is not None:
        data["checkpoint"]["every_train_iterations"] = args.checkpoint_every
    return write_yaml(work / "config.yaml", data)


def _run_roles(args: argparse.Namespace, up: Up, url: str, redis_server: RedisServer,
               results: list[Result]) -> None:
    meter = Meter(url)
    try:
        wait_working(meter, args.collectors, args.start_timeout_s)
        for role in args.roles:
            base = measure_baseline(meter, args.baseline_s, args.threshold,
                                    train_too=role == "learner")
            log(f"{role}: baseline {base.rates.env_steps:,.0f} env steps/s, "
                f"{base.rates.train_iterations:,.0f} train it/s; killing it...")
            result = recover(role, up, meter, redis_server, base, args.threshold,
                             args.timeout_s)
            results.append(result)
            log(f"{role}: back after {fmt(result.back_s, '.1f', ' s')}, recovered after "
                f"{fmt(result.recovery_s, '.1f', ' s')} {result.note}")
            if result.recovery_s is None:
                wait_working(meter, args.collectors, args.timeout_s)  # or give up here
    finally:
        meter.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--roles", nargs="+", choices=ROLES, default=list(ROLES))
    p.add_argument("--timeout-s", type=float, default=90.0,
                   help="seconds each role may take to recover before it reports null")
    p.add_argument("--collectors", type=int, default=2)
    p.add_argument("--baseline-s", type=float, default=5.0)
    p.add_argument("--threshold", type=float, default=0.9,
                   help="fraction of the baseline that counts as recovered")
    p.add_argument("--snapshot-interval-s", type=float, default=5.0,
                   help="the coordinator's snapshot interval (what a restart resumes from)")
    p.add_argument("--checkpoint-every", type=int, default=None,
                   help="the learner's checkpoint interval in train iterations (what a "
                   "restarted learner redoes at most); default: the config's")
    p.add_argument("--epsilon", type=float, default=0.1, help="collectors' constant epsilon")
    p.add_argument("--start-timeout-s", type=float, default=120.0)
    p.add_argument("--max-wall-s", type=float, default=3600.0)
    p.add_argument("--config", type=Path, default=REPO_ROOT / "configs" / "cartpole-dqn.yaml")
    p.add_argument("--keep", action="store_true", help="keep the work dir (logs, Redis's AOF)")
    args = parse_args(p, argv, SHORT)
    if shutil.which("redis-server") is None:
        p.error("redis-server is not on PATH")

    work = Path(tempfile.mkdtemp(prefix="rlfleet-recovery-"))
    redis_server = RedisServer(work)
    results: list[Result] = []
    up: Up | None = None
    url: str | None = None
    error: str | None = None
    checkpoint_every: int | None = None
    try:
        redis_server.start()
        config = bench_config(args.config, work, redis_server.url, args)
        checkpoint_every = yaml.safe_load(config.read_text())["checkpoint"][
            "every_train_iterations"]
        log(f"roles {args.roles}, {args.collectors} collectors, Redis on port "
            f"{redis_server.port}, work dir {work}")
        up = Up(config, work / "run", args.collectors, redis_server.url)
        url = wait_for(up.coordinator_url, 60, "URL of the coordinator")
        _run_roles(args, up, url, redis_server, results)
    except (RuntimeError, HttpError) as err:
        error = str(err)
        log(f"[red]{err}[/]")
    finally:
        code = up.stop(url) if up is not None else None
        redis_server.stop()
    failed = error is not None or any(r.recovery_s is None for r in results)
    if failed or code not in (0, 3) or args.keep:
        progress.print(f"work dir with the logs kept: {work}", markup=False)
        if up is not None:
            progress.print(up.output(), markup=False)
    else:
        shutil.rmtree(work, ignore_errors=True)
    never = [r.role for r in results if r.recovery_s is None]
    if never:
        log(f"[red]never recovered within {args.timeout_s:g} s: {', '.join(never)}[/]")

    def per_role(get: Callable[[Result], float | None], digits: int = 2) -> dict:
        return {r.role: rounded(get(r), digits) for r in results}

    report({
        **({"error": error} if error is not None else {}),
        "recovery_s": per_role(lambda r: r.recovery_s),
        "role_back_s": per_role(lambda r: r.back_s),
        "baseline_env_steps_per_s": per_role(lambda r: r.baseline.rates.env_steps, 1),
        "env_steps_per_s_after": per_role(lambda r: r.after and r.after.env_steps, 1),
        "baseline_train_iterations_per_s": per_role(
            lambda r: r.baseline.rates.train_iterations, 1),
        "train_iterations_per_s_after": per_role(
            lambda r: r.after and r.after.train_iterations, 1),
        "baseline_steady": per_role(lambda r: r.baseline.steady),
        "notes": {r.role: r.note for r in results if r.note},
        "launcher_exit_code": code,
        "threshold": args.threshold,
        "collectors": args.collectors,
        "baseline_s": args.baseline_s,
        "timeout_s": args.timeout_s,
        "snapshot_interval_s": args.snapshot_interval_s,
        "checkpoint_every_train_iterations": checkpoint_every,
        "rate_window_s": RATE_WINDOW_S,
        "cpu_count": os.cpu_count(),
    }, report_table(results, args.threshold, args.collectors))
    return 1 if failed else 0


if __name__ == "__main__":
    run_main(main)
