"""`rlfleet up`: a whole cluster as local processes, watched until it solves, fails or is
interrupted.

Each role is its own process running the same `rlfleet <role>` command a container runs, on a
free loopback port. All start at once: workers register themselves (retrying until the
coordinator answers). The first children are forks of the launcher, which has imported what
they need once (`services/forking.py`); later ones (restarts, scaling) exec. The launcher
never imports torch (`check_runnable(build=False)`; a config that names code by import path
is checked by a `rlfleet check` child). Children get a process group of their own (Ctrl-C
reaches only the launcher, which then stops them in order: workers first, so they can leave
cleanly, then the coordinator) and a parent-death signal (if the launcher is killed outright,
they die with it: no orphans).

The launcher supervises its children the way compose's `restart:` or a Kubernetes Deployment
does, so a local run survives what a deployed one survives: a child that exits on
its own is started again after a back-off (0.5 s doubling to 8 s), under the same name and
worker id (a worker re-registers as itself; the learner resumes from its last checkpoint), the
coordinator on the same port (workers were given its URL) and always with `--resume` (it
restores its snapshot from storage). After `--max-restarts` restarts of one child the run ends
as crashed, as every crash did before supervision.
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rlfleet.cli import free_port
from rlfleet.forking import ForkedChild, can_fork, fork_role, preload
from rlfleet.shared.contract.config import ConfigError
from rlfleet.shared.contract.schemas import API
from rlfleet.shared.infra.crash import CRASH_FILE_ENV, read_crash, signature
from rlfleet.shared.infra.http import HttpClient, HttpError
from rlfleet.shared.infra.storage.credentials import (
    PASSWORD_ENV,
    PASSWORD_FILE_ENV,
    configured_password,
    has_password,
    split_password,
)
from rlfleet.shared.run.config import RunConfig, dump_config, load_config

_PR_SET_PDEATHSIG = 1
# Restart back-off per child: the first restart waits this long, each next one twice as long.
RESTART_DELAY_S = 0.5
MAX_RESTART_DELAY_S = 8.0
# The same error (where, type, message) this many times, from any child: the run ends.
SAME_CRASH_LIMIT = 3


def _child_setup(nice: int) -> None:
    """Runs in the child right after the fork (before exec, or before the role's code)."""
    if nice:
        os.nice(nice)
    _die_with_parent()


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass  # not Linux: Ctrl-C and normal exits still stop children
    # A process group of its own, so a terminal's Ctrl-C reaches the launcher only (which
    # stops the children in order), but not a session of its own: Linux's scheduler gives
    # every session (autogroup) an equal share of the CPU whatever its niceness, so with one
    # session per child a niced collector or torch import took as much CPU as the learner's
    # training thread or the coordinator's start.
    os.setpgid(0, 0)


class ChildFailed(RuntimeError):
    pass


@dataclass
class Child:
    name: str
    role: str
    proc: subprocess.Popen | ForkedChild
    log_path: Path
    port: int
    # What it was started with, so the supervisor can start it again alike.
    args: list[str] = field(default_factory=list)
    nice: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    @property
    def crash_path(self) -> Path:
        return self.log_path.with_name(f"{self.name}.crash.json")

    def crash(self) -> dict | None:
        """The error this child died of, as it recorded it (`shared/infra/crash.py`); None while
        it runs, after a clean exit, or when it was killed before it could say."""
        if self.proc.poll() in (None, 0):
            return None
        return read_crash(self.crash_path)

    def exit_text(self) -> str:
        return f"{self.name} (pid {self.proc.pid}) exited with code {self.proc.returncode}"


@dataclass
class Restart:
    """One child started again: the exit that caused it and the child that replaced it."""
    exited: str          # "<name> (pid N) exited with code C"
    attempt: int         # 1 for the child's first restart
    limit: int
    child: Child

    def __str__(self) -> str:
        return f"{self.exited}: restarting ({self.attempt}/{self.limit})"


class RestartsExhausted(ChildFailed):
    """A child exited once more than `--max-restarts` allows: the run ends as crashed."""

    def __init__(self, child: Child, restarts: int, why: str = "") -> None:
        self.child = child
        self.crash = child.crash()  # the error it died of, when it recorded one
        after = f" after {restarts} restarts" if restarts else ""
        super().__init__(f"{child.exit_text()}{_reason(self.crash)}{after}{why}")


class SameCrash(RestartsExhausted):
    """The same error came back `SAME_CRASH_LIMIT` times (an env that always raises): no
    number of restarts will mend it, so the run ends at once instead of after all of them."""

    def __init__(self, child: Child, restarts: int, times: int) -> None:
        super().__init__(child, restarts, f": the same error {times} times, giving up")


def _reason(crash: dict | None) -> str:
    if not crash:
        return ""
    return f" in {crash.get('where')}: {crash.get('error')}"


def restart_delay(restarts: int) -> float:
    """Seconds to wait before a child's next restart, given how often it was restarted: a
    child that dies at once again and again must not spin the machine (or flood its log)."""
    return min(MAX_RESTART_DELAY_S, RESTART_DELAY_S * 2 ** restarts)


class LocalCluster:
    def __init__(self, config_path: Path, run_dir: Path, storage: str,
                 collector_nice: int = 0, resume: bool = False, max_restarts: int = 0,
                 fork: bool = False) -> None:
        self.collector_nice = collector_nice
        # Fork children from this process while it can (`services/forking.py`): only a
        # launcher of its own should (a test's process holds torch and threads).
        self.fork = fork
        self.resume = resume
        self.max_restarts = max_restarts
        self.restarts: Counter[str] = Counter()  # by child name
        self._restart_due: dict[str, float] = {}  # name -> when its pending restart may run
        self._crashes: Counter[tuple[str, str, str]] = Counter()  # recorded errors, by kind
        self.stopping = False  # shutting down, or the run is over: no more restarts
        self.config_path = config_path
        self.run_dir = run_dir
        self.storage = storage
        self.log_dir = run_dir / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.children: list[Child] = []
        self.retired: list[Child] = []  # collectors being drained or drained
        self.coordinator: Child | None = None
        self._collector_seq = 0
        self._learner_seq = 0
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.env.pop("RLFLEET_COORDINATOR", None)

    def _launch(self, name: str, role: str, args: list[str], port: int, nice: int = 0) -> Child:
        """Start one process; its output goes to <run-dir>/logs/<name>.log (appended, so a
        restarted child continues the same log)."""
        log_path = self.log_dir / f"{name}.log"
        # Where it records the error it dies of; an older one is of a process now gone.
        crash_path = self.log_dir / f"{name}.crash.json"
        crash_path.unlink(missing_ok=True)
        env = {**self.env, CRASH_FILE_ENV: str(crash_path)}
        # The port and the worker id first: a forked child's title (its command line in
        # `ps`) is cut to the launcher's length, and these name it.
        argv = [role, "--port", str(port), *args]
        setup = functools.partial(_child_setup, nice)
        if self.fork and can_fork():
            preload(role)
            return Child(name, role, fork_role(argv, log_path, env, setup), log_path, port,
                         args, nice)
        log = open(log_path, "ab")  # noqa: SIM115 - handed to the child, closed at exit
        # No stdin: a child is in the terminal's session, in a background process group.
        proc = subprocess.Popen([sys.executable, "-m", "rlfleet", *argv],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                env=env, preexec_fn=setup, cwd=os.getcwd())
        log.close()
        return Child(name, role, proc, log_path, port, args, nice)

    def _spawn(self, name: str, role: str, args: list[str], port: int, nice: int = 0) -> Child:
        child = self._launch(name, role, args, port, nice)
        self.children.append(child)
        return child

    def _coordinator_args(self, resume: bool) -> list[str]:
        return ["--config", str(self.config_path), "--run-dir", str(self.run_dir),
                "--storage", self.storage, *(["--resume"] if resume else [])]

    def start_coordinator(self, timeout_s: float = 60.0, wait: bool = True,
                          port: int | None = None) -> Child:
        """Start the coordinator (on `port`, or a free one); with `wait`, return once it
        answers `/health`. Workers need not wait for it (they register once it answers):
        `up` starts them meanwhile and calls `wait_coordinator` after."""
        port = port or free_port()
        self.coordinator = self._spawn("coordinator", "coordinator",
                                       self._coordinator_args(self.resume), port)
        if wait:
            self.wait_coordinator(timeout_s)
        return self.coordinator

    def wait_coordinator(self, timeout_s: float = 60.0) -> Child:
        """Block until the coordinator answers `/health`; `ChildFailed` if it exits first or
        does not answer in time."""
        assert self.coordinator is not None
        client = HttpClient(self.coordinator.url, timeout_s=2, retries=0)
        deadline = time.monotonic() + timeout_s
        try:
            while time.monotonic() < deadline:
                if self.coordinator.proc.poll() is not None:
                    raise ChildFailed(f"coordinator exited with code "
                                      f"{self.coordinator.proc.returncode} while starting:\n"
                                      f"{self.coordinator.tail()}")
                try:
                    client.get("/health")
                    return self.coordinator
                except HttpError:
                    time.sleep(0.05)
        finally:
            client.close()
        raise ChildFailed(f"coordinator did not answer /health within {timeout_s}s")

    def _worker_args(self) -> list[str]:
        assert self.coordinator is not None
        return ["--coordinator", self.coordinator.url]

    def start_learner(self) -> Child:
        return self.add_learner()

    def add_learner(self) -> Child:
        """Another learner: it joins the learner group, which re-forms to take it in. The
        first is `learner`, then `learner-2`, `learner-3`, ..."""
        self._learner_seq += 1
        name = "learner" if self._learner_seq == 1 else f"learner-{self._learner_seq}"
        return self._spawn(name, "learner", ["--worker-id", name, *self._worker_args()],
                           free_port())

    def learners(self) -> list[Child]:
        """Learners not being drained, oldest first (a crashed one counts: it restarts)."""
        return [c for c in self.children if c.role == "learner" and c not in self.retired]

    def add_collector(self) -> Child:
        self._collector_seq += 1
        name = f"collector-{self._collector_seq}"
        return self._spawn(name, "collector", ["--worker-id", name, *self._worker_args()],
                           free_port(), nice=self.collector_nice)

    def add_evaluator(self) -> Child:
        """A collector that only evaluates (`--evaluate-only`): an offline run has no
        collectors, and its evaluations still step envs."""
        return self._spawn("evaluator", "collector", ["--worker-id", "evaluator",
                                                      "--evaluate-only", *self._worker_args()],
                           free_port(), nice=self.collector_nice)

    def exited(self) -> list[Child]:
        """Children that exited on their own (drained collectors are expected to exit)."""
        return [c for c in self.children if c.proc.poll() is not None and c not in self.retired]

    def crashed(self) -> Child | None:
        """A child that exited on its own, if any (for callers that do not supervise)."""
        exited = self.exited()
        return exited[0] if exited else None

    # -- supervision ------------------------------------------------------------------------

    def restart_crashed(self, now: float | None = None) -> list[Restart]:
        """Start again every child that exited on its own and whose back-off has passed;
        what was restarted. Raises `RestartsExhausted` for a child that exited once more
        than `max_restarts` allows. Nothing is restarted once `stopping` is set."""
        if self.stopping:
            return []
        now = time.monotonic() if now is None else now
        done = []
        for child in self.exited():
            if child.name not in self._restart_due:  # first seen exited: count its error
                crash = child.crash()
                if crash is not None:
                    self._crashes[signature(crash)] += 1
                    if self._crashes[signature(crash)] >= SAME_CRASH_LIMIT:
                        raise SameCrash(child, self.restarts[child.name],
                                        self._crashes[signature(crash)])
            if self.restarts[child.name] >= self.max_restarts:
                raise RestartsExhausted(child, self.restarts[child.name])
            due = self._restart_due.setdefault(
                child.name, now + restart_delay(self.restarts[child.name]))
            if now >= due:
                done.append(self._restart(child))
        return done

    def _restart(self, old: Child) -> Restart:
        """The same command again, in the same place in `children`: a worker on a new free
        port (it registers its new URL under its old id), the coordinator on its old port
        (every worker was given that URL) and with `--resume`, always: it restores the run
        from storage, or starts fresh where no snapshot was written yet."""
        self.restarts[old.name] += 1
        self._restart_due.pop(old.name, None)
        attempt = self.restarts[old.name]
        exited = old.exit_text() + _reason(old.crash())
        with open(old.log_path, "a") as log:
            log.write(f"--- rlfleet up: {exited}: restarting ({attempt}/{self.max_restarts}) "
                      "---\n")
        if old is self.coordinator:
            args = self._coordinator_args(resume=True)
            new = self.coordinator = self._launch(old.name, old.role, args, old.port)
        else:
            new = self._launch(old.name, old.role, old.args, free_port(), old.nice)
        self.children[self.children.index(old)] = new
        return Restart(exited, attempt, self.max_restarts, new)

    def collectors(self) -> list[Child]:
        """Collectors not being drained, oldest first. One that crashed counts: it is about to
        be restarted, and scaling must not start another in its place."""
        return [c for c in self.children if c.role == "collector" and c.name != "evaluator"
                and c not in self.retired]

    def retire_collector(self) -> Child | None:
        """Drain the newest collector: SIGTERM makes it finish its chunk, write and report
        everything it holds, end its task and leave, then exit."""
        return self._retire(self.collectors())

    def _retire(self, active: list[Child]) -> Child | None:
        if not active:
            return None
        child = active[-1]
        self.retired.append(child)
        child.proc.terminate()
        return child

    def reconcile(self, desired: int) -> tuple[list[Child], list[Child]]:
        """Start or drain collectors until `desired` are running; (added, retired)."""
        return self._reconcile(desired, self.collectors, self.add_collector)

    def reconcile_learners(self, desired: int) -> tuple[list[Child], list[Child]]:
        """Start or stop learners until `desired` are running (a stopped learner leaves
        the group, which re-forms without it); (added, retired)."""
        return self._reconcile(desired, self.learners, self.add_learner)

    def _reconcile(self, desired: int, active: Callable[[], list[Child]],
                   add: Callable[[], Child]) -> tuple[list[Child], list[Child]]:
        added, retired = [], []
        while len(active()) < desired:
            added.append(add())
        while len(active()) > desired:
            child = self._retire(active())
            if child is None:
                break
            retired.append(child)
        return added, retired

    def stop(self, children: list[Child], timeout_s: float = 20.0) -> None:
        for child in children:
            if child.proc.poll() is None:
                child.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for child in children:
            try:
                child.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.proc.kill()
                child.proc.wait()

    def stop_workers(self) -> None:
        """Collectors and learners first: what they deliver while leaving still counts, and
        the coordinator is still there to take it."""
        self.stopping = True
        self.stop([c for c in self.children if c is not self.coordinator])

    def shutdown(self) -> None:
        self.stop_workers()
        if self.coordinator is not None:
            self.stop([self.coordinator])


def names_code(cfg: RunConfig) -> bool:
    """Whether a config names code by import path (`algo.policy`, `algo.reward_model`, or an
    `env.id` such as `package.module:Env`): only importing and building it can check it."""
    return bool(cfg.algo.policy) or cfg.algo.reward_model is not None or ":" in cfg.env.id


def check_config(cfg: RunConfig, path: Path | str) -> None:
    """`check_runnable` without torch or anyone's code in this process, which then watches
    the run for its whole length. A built-in algorithm on a gymnasium env is checked here
    without building the policy: the env's module, gymnasium and numpy are what the forked
    collectors need anyway (`services/forking.py`). A config that names code by import path
    is built by a `rlfleet check` child (that code may import torch), whose one-line error
    becomes ours. Raises `ConfigError`."""
    if not names_code(cfg):
        from rlfleet.shared.run.check import check_runnable

        check_runnable(cfg, build=False)
        return
    done = subprocess.run([sys.executable, "-m", "rlfleet", "check", "--config",
                           str(path)], capture_output=True, text=True, cwd=os.getcwd())
    text = done.stderr.strip()
    if done.returncode != 0:
        said = text.find("rlfleet check: ")
        if said >= 0:  # a ConfigError, said in full (after any warnings)
            raise ConfigError(text[said:].removeprefix("rlfleet check: "))
        last = text.splitlines()[-1] if text else f"exit code {done.returncode}"
        raise ConfigError(f"building what {path} names failed: {last}")
    # what the check warned of (an old import path, a name one typo from a hook)
    for line in [*text.splitlines(), *done.stdout.splitlines()]:
        if "Warning:" in line or line.startswith("warning: "):
            print(line.strip(), file=sys.stderr)


LAUNCH_FILE = "launch.json"  # the worker counts a run was started with


def _resolve(args) -> tuple[Path, Path, str, dict]:
    cfg = load_config(args.config)
    check_config(cfg, args.config)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir = Path(args.run_dir or Path("runs") / f"{cfg.name}-{stamp}").resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    storage = _hold_password(args.storage or cfg.storage or str(run_dir / "storage"))
    stop = cfg.stop.model_dump()
    if args.max_wall_s:
        stop["max_wall_s"] = args.max_wall_s
    if args.max_env_steps:
        stop["max_env_steps"] = args.max_env_steps
    # The run's name is its directory's: unique per run, so a shared Redis never mixes runs.
    learner = None
    if getattr(args, "learners", None) is not None:  # validated like the file's learner.count
        learner = {**cfg.learner.model_dump(), "count": args.learners}
    cfg = cfg.with_overrides(seed=args.seed, name=run_dir.name[:64], storage=storage, stop=stop,
                             learner=learner)
    data = _absolute_paths(cfg.model_dump(mode="json"), run_dir)
    resolved = run_dir / "config.yaml"
    resolved.write_text(dump_config(data))
    return resolved, run_dir, storage, data


def _absolute_paths(data: dict, run_dir: Path) -> dict:
    """Paths the workers read, made absolute (they may run elsewhere than this directory):
    datasets relative to where `up` was run, the buffer saver's directory to the run's."""
    for bcfg in data["buffers"].values():
        if bcfg.get("path"):
            bcfg["path"] = str(Path(bcfg["path"]).expanduser().resolve())
    if (data["eval"].get("dataset") or {}).get("path"):
        data["eval"]["dataset"]["path"] = str(Path(data["eval"]["dataset"]["path"])
                                              .expanduser().resolve())
    if data["collector"].get("save_to"):
        data["collector"]["save_to"] = str(run_dir / Path(data["collector"]["save_to"])
                                           .expanduser())
    return data


def _resolve_resume(args) -> tuple[Path, Path, str, dict]:
    """A run directory `rlfleet up` made: its resolved config names the run and its storage,
    where the coordinator's snapshot and the learner's checkpoints are."""
    run_dir = Path(args.run_dir).resolve()
    config_path = run_dir / "config.yaml"
    if not config_path.is_file():
        raise ConfigError(f"{run_dir} is not a run directory: it has no config.yaml")
    cfg = load_config(config_path)
    check_config(cfg, config_path)
    stop = cfg.stop.model_dump()
    if args.max_wall_s:
        stop["max_wall_s"] = args.max_wall_s
    if args.max_env_steps:
        stop["max_env_steps"] = args.max_env_steps
    if stop != cfg.stop.model_dump():
        cfg = cfg.with_overrides(stop=stop)
        config_path.write_text(dump_config(cfg.model_dump(mode="json")))
    # summary.json is written as a run ends; a run killed before then left launch.json
    previous = next((p for p in (run_dir / "summary.json", run_dir / LAUNCH_FILE)
                     if p.is_file()), None)
    before = json.loads(previous.read_text()) if previous is not None else {}
    # The coordinator restores the last `rlfleet scale` wish; a count given here replaces it.
    args.collectors_given = args.collectors is not None
    if args.collectors is None:
        args.collectors = before.get("collectors", 2)
    if args.learners is None:
        args.learners = before.get("learners")
    args.config, args.seed = config_path, cfg.seed
    assert cfg.storage is not None  # `up` always writes the storage it used
    return config_path, run_dir, _hold_password(cfg.storage), cfg.model_dump(mode="json")


def _hold_password(storage: str) -> str:
    """The storage URL with its password redacted, for the config, the console and every
    file of the run. The processes this launcher starts get the password in their
    environment (`RLFLEET_STORAGE_PASSWORD`), never on a command line; a URL whose password
    was redacted already (a resumed run) needs it configured (`RLFLEET_STORAGE_PASSWORD_FILE`)."""
    storage, password = split_password(storage)
    if password is not None:
        os.environ[PASSWORD_ENV] = password
    elif has_password(storage) and configured_password() is None:
        raise ConfigError(f"storage {storage} needs its password: name a file holding it in "
                          f"{PASSWORD_FILE_ENV} (or give the whole URL with --storage)")
    return storage


def _progress_text(status: dict, elapsed: float) -> str:
    c, r = status["counters"], status["rates"]
    ev = status.get("latest_evaluation")
    ev_txt = f"{ev['return_mean']:.1f}" if ev else "-"
    alive = sum(1 for w in status["workers"] if w["state"] == "alive"
                and w["role"] == "collector")
    group = status.get("learner_group") or {}
    learners = (f"  learners {group['world_size']} (gen {group['generation']})"
                if group.get("world_size", 1) > 1 else "")
    return (f"{elapsed:6.1f}s  env steps {c['env_steps']:>9,}  {r['env_steps_per_s']:>8,.0f}/s  "
            f"train it {c['train_iterations']:>8,}  policy v{c['policy_version']:<6}  "
            f"eval {ev_txt:>6}  collectors {alive}{learners}")


Say = Callable[[str], None]  # prints one line (rich markup) to the console


class StatusPoller:
    """Reads the run's status for the watch loop. While the coordinator is down (crashed and
    being restarted) reads fail: that is an outage to wait out, not the end of the run, and
    it is said once when it starts and once when it ends, not on every poll."""

    def __init__(self, url: str, say: Say) -> None:
        self.client = HttpClient(url, timeout_s=5, retries=2)
        self.say = say
        self.down_since: float | None = None

    def poll(self) -> dict | None:
        try:
            status = self.client.get(f"{API}/status")
        except HttpError as err:
            if self.down_since is None:
                self.down_since = time.monotonic()
                self.say(f"[yellow]coordinator status unavailable: {err}[/]")
            return None
        if self.down_since is not None:
            self.say(f"coordinator status available again after "
                     f"{time.monotonic() - self.down_since:.1f} s")
            self.down_since = None
        return status

    def close(self) -> None:
        self.client.close()


def _supervise(cluster: LocalCluster, say: Say) -> None:
    """Restart whatever crashed (raises `RestartsExhausted` past the limit)."""
    for restart in cluster.restart_crashed():
        say(f"[yellow]{restart}[/]")


def _scale(cluster: LocalCluster, status: dict, say: Say) -> None:
    """Start or drain collectors and learners to match what `rlfleet scale` asked for."""
    desired = status["run"].get("collectors_desired")
    if desired is not None and desired != len(cluster.collectors()):
        added, retired = cluster.reconcile(desired)
        if added or retired:
            say(f"scaling to {desired} collectors: started {[c.name for c in added]}, "
                f"draining {[c.name for c in retired]}")
    learners = status["run"].get("learners_desired")
    if learners is not None and learners != len(cluster.learners()):
        added, retired = cluster.reconcile_learners(learners)
        if added or retired:
            say(f"scaling to {learners} learners: started {[c.name for c in added]}, "
                f"stopping {[c.name for c in retired]}")


def _wish_collectors(url: str, n: int) -> None:
    from rlfleet.shared.contract.schemas import API
    from rlfleet.shared.infra.http import HttpClient

    client = HttpClient(url, timeout_s=10, retries=5)
    try:
        client.post(f"{API}/scale", {"collectors": n})
    finally:
        client.close()


def up(args) -> int:
    launched = time.monotonic() - process_age_s()  # this process's start, on our clock
    resume = getattr(args, "resume", False)
    config_path, run_dir, storage, cfg = _resolve_resume(args) if resume else _resolve(args)
    # What a resume of a run killed before its summary starts again with.
    (run_dir / LAUNCH_FILE).write_text(json.dumps(
        {"collectors": args.collectors, "learners": getattr(args, "learners", None)}))
    # Where start-up time goes, from the launch (`summary.json`: `startup_s`).
    startup = {"config_checked": time.monotonic() - launched}
    cluster = LocalCluster(config_path, run_dir, storage, collector_nice=args.collector_nice,
                           resume=resume, max_restarts=args.max_restarts, fork=True)
    started = time.monotonic()
    status: dict | None = None
    poller: StatusPoller | None = None
    outcome, code, error = "stopped", 3, None
    crash: dict | None = None  # the error a child died of, when that ended the run

    interrupted = False

    def on_sigint(signum, frame):
        nonlocal interrupted
        interrupted = True

    old_int = signal.signal(signal.SIGINT, on_sigint)
    old_term = signal.signal(signal.SIGTERM, on_sigint)
    old_hup = signal.signal(signal.SIGHUP, on_sigint)  # a closed terminal stops it in order
    if args.learners is None:
        args.learners = int(cfg["learner"].get("count", 1))
    first_chunk: FirstChunk | None = None if resume else FirstChunk(launched)
    try:
        # Everything at once: workers register as soon as the coordinator answers.
        cluster.start_coordinator(wait=False, port=args.port)
        for _ in range(args.learners):
            cluster.add_learner()
        for _ in range(args.collectors):
            cluster.add_collector()
        if args.collectors == 0:  # an offline run: learners, and an env to evaluate in
            cluster.add_evaluator()
        # Later children (restarts, scaling) exec: a fresh process for a crashed one, and this
        # process now holds connections and, with the progress display, a thread.
        cluster.fork = False
        # rich is the launcher's alone (50 ms of imports): it loads once the children are off.
        # soft_wrap: lines are not cut at the console's width (80 columns when stderr is a
        # file or a pipe), so paths and tracebacks stay whole in logs.
        from rich.console import Console
        from rich.live import Live
        from rich.markup import escape
        from rich.text import Text

        console = Console(stderr=True, soft_wrap=True)
        console.print(f"[bold]rlfleet {'resume' if resume else 'up'}[/]: {cfg['env']['id']} "
                      f"with {args.collectors} collectors, {args.learners} learner"
                      f"{'s' if args.learners != 1 else ''}, storage {storage}, run dir "
                      f"{run_dir}")
        cluster.wait_coordinator()
        startup["coordinator_answered"] = time.monotonic() - launched
        console.print(f"dashboard: {cluster.coordinator.url}/  (status: rlfleet status "
                      f"--coordinator {cluster.coordinator.url})", soft_wrap=True)
        if resume and args.collectors_given:
            _wish_collectors(cluster.coordinator.url, args.collectors)
        poller = StatusPoller(cluster.coordinator.url, console.print)
        live_ok = console.is_terminal and not args.quiet
        last_print = 0.0
        with Live(Text("starting..."), console=console, refresh_per_second=4,
                  transient=False) if live_ok else _NullLive() as live:
            while True:
                if interrupted:
                    outcome, code, error = "interrupted", 130, "interrupted by signal"
                    break
                _supervise(cluster, console.print)
                asked = time.monotonic()
                polled = poller.poll()
                if polled is None:
                    time.sleep(0.5)
                    continue
                status = polled
                if first_chunk is not None and not cluster.restarts["coordinator"]:
                    first_chunk.observe(status, asked, time.monotonic())
                _scale(cluster, status, console.print)
                line = _progress_text(status, time.monotonic() - started)
                if live_ok:
                    live.update(Text(line))
                elif time.monotonic() - last_print >= 5 and not args.quiet:
                    print(line, file=sys.stderr, flush=True)
                    last_print = time.monotonic()
                if status["run"]["state"] == "stopped":
                    cluster.stopping = True  # workers may leave now: no restarts
                    solved = status["run"]["solved"]
                    outcome, code = ("solved", 0) if solved else ("stopped", 3)
                    console.print(f"run stopped: {status['run']['stop_reason']}")
                    break
                time.sleep(0.25)
    except RestartsExhausted as err:
        outcome, code, error = "crashed", 1, str(err)
        if err.crash is not None:
            crash = {"child": err.child.name, "exit_code": err.child.proc.returncode,
                     **err.crash}
        limit = "" if isinstance(err, SameCrash) else f" (--max-restarts {cluster.max_restarts})"
        console.print(f"[red]{escape(error)}[/]{limit}; last lines of {err.child.log_path}:\n"
                      f"{escape(err.child.tail())}")
    except ChildFailed as err:
        outcome, code, error = "crashed", 1, str(err)
        console.print(f"[red]{escape(error)}[/]")
    finally:
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, old_term)
        signal.signal(signal.SIGHUP, old_hup)
        _save_evaluations(cluster, run_dir)
        cluster.stop_workers()
        if poller is not None:
            # the summary's counters once nothing more can arrive: chunks that workers
            # delivered after the stop count in them, as they do in league.json; the rest
            # (evaluations, the learner group) stays as it was when the run stopped
            final = poller.poll() if status is not None and outcome != "interrupted" else None
            if final is not None and "counters" in final:
                status = {**status, "counters": final["counters"]}
            poller.close()
        cluster.shutdown()
    summary = _summary(status, outcome, error, time.monotonic() - started, args, storage,
                       run_dir, cfg, dict(cluster.restarts))
    summary["crash"] = crash
    summary["first_chunk_s_from_launch"] = (
        round(first_chunk.seconds, 3) if first_chunk and first_chunk.seconds is not None
        else None)
    if summary["first_chunk_s_from_launch"] is not None:
        startup["first_chunk"] = summary["first_chunk_s_from_launch"]
    summary["startup_s"] = {k: round(v, 3) for k, v in startup.items()}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    console.print(f"summary: {run_dir / 'summary.json'}: solved={summary['solved']} "
                  f"eval_return={_fmt(summary['eval_return'])} env_steps={summary['env_steps']} "
                  f"wall_seconds={summary['wall_seconds']:.1f}")
    return code


def process_age_s() -> float:
    """Seconds since this process started (Linux: its start time in /proc, against the same
    boot clock), so a start-up figure includes the interpreter's start and our imports; 0.0
    where that cannot be read."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0
    return max(0.0, age)


class FirstChunk:
    """When the coordinator accepted its first chunk, in seconds from the launch of `rlfleet
    up` (`summary.json`: `first_chunk_s_from_launch`). The coordinator says it on its own
    clock (`run.first_chunk_s` from its start, beside `run.wall_seconds`); their difference is
    how long ago that was when it answered, which places it on ours (within the half of one
    status request's round trip). Observed from a coordinator that has not restarted."""

    def __init__(self, launched: float) -> None:
        self.launched = launched
        self.seconds: float | None = None

    def observe(self, status: dict, asked: float, answered: float) -> None:
        run = status.get("run", {})
        if (self.seconds is not None or run.get("first_chunk_s") is None
                or run.get("state") == "stopped"):  # a stopped run's wall clock stands still
            return
        ago = float(run["wall_seconds"]) - float(run["first_chunk_s"])
        self.seconds = max(0.0, (asked + answered) / 2 - ago - self.launched)


def _save_evaluations(cluster: LocalCluster, run_dir: Path) -> None:
    """Keep the coordinator's evaluation history (`GET /api/v1/evaluations`, the newest 500)
    in `<run-dir>/evaluations.json` before it stops: time-to-threshold figures need it."""
    coordinator = cluster.coordinator
    if coordinator is None or coordinator.proc.poll() is not None:
        return
    client = HttpClient(coordinator.url, timeout_s=5, retries=1)
    evaluations: list[dict] = []
    try:
        since, more = 0, True
        while more:  # the coordinator answers a page at a time
            page = client.get(f"{API}/evaluations?since={since}&limit=1000")
            evaluations += page["evaluations"]
            since, more = page["next"], page["more"]
    except HttpError as err:
        print(f"evaluation history not saved: {err}", file=sys.stderr)
        return
    finally:
        client.close()
    (run_dir / "evaluations.json").write_text(json.dumps(evaluations, indent=2))


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _summary(status: dict | None, outcome: str, error: str | None, wall: float, args,
             storage: str, args_run_dir: Path | None = None, cfg: dict | None = None,
             restarts: dict[str, int] | None = None) -> dict:
    s = status or {}
    counters = s.get("counters", {})
    latest = s.get("latest_evaluation") or {}
    best = s.get("best_evaluation") or {}
    best_policy = args_run_dir / "best_policy.safetensors" if args_run_dir else None
    videos = (sorted(p.relative_to(args_run_dir).as_posix()
                     for p in (args_run_dir / "videos").glob("*.mp4"))
              if args_run_dir else [])
    return {
        "solved": bool(s.get("run", {}).get("solved", False)),
        "outcome": outcome,
        "error": error,
        "stop_reason": s.get("run", {}).get("stop_reason"),
        "eval_return": latest.get("return_mean"),
        "eval_return_std": latest.get("return_std"),
        "eval_stochastic_return": (latest.get("stochastic") or {}).get("return_mean"),
        "best_eval_return": best.get("return_mean"),
        # goal-conditioned envs (info["is_success"]); None for envs that report no success
        "eval_success_rate": latest.get("success_rate"),
        "best_eval_success_rate": best.get("success_rate"),
        "best_policy_version": best.get("policy_version"),
        "best_policy": str(best_policy) if best_policy and best_policy.exists() else None,
        # eval.video: every evaluation's video (videos/eval-<seq>-v<version>-<steps>.mp4)
        "videos": videos,
        "best_video": (best or {}).get("video"),
        "stop_value": s.get("run", {}).get("stop_value"),
        "env_steps": counters.get("env_steps", 0),
        "train_iterations": counters.get("train_iterations", 0),
        "policy_version": counters.get("policy_version", -1),
        "chunks_accepted": counters.get("chunks_accepted", 0),
        "episodes": counters.get("episodes", 0),
        "wall_seconds": round(wall, 3),
        "run_seconds": s.get("run", {}).get("wall_seconds"),
        "first_chunk_seconds": s.get("run", {}).get("first_chunk_s"),
        "collectors": args.collectors,
        "learners": getattr(args, "learners", 1),
        "learner_group": s.get("learner_group"),
        "restarts": restarts or {},  # by child name: how often the launcher restarted it
        "seed": args.seed if args.seed is not None else (cfg or {}).get("seed"),
        "storage": storage,
        "config": str(args.config),
        "algo": (cfg or {}).get("algo", {}).get("name"),
        "train": s.get("train", {}),
        "env": (cfg or {}).get("env", {}).get("id"),
    }


class _NullLive:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def update(self, *_a, **_k) -> None:
        pass
