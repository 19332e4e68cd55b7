"""The children of `rlfleet up`, supervised: started at once, started again when they exit on
their own, scaled to the run's wish, and stopped in order.

The launcher supervises its children the way compose's `restart:` or a Kubernetes Deployment
does, so a local run survives what a deployed one survives: a child that exits on its own is
started again after a back-off (0.5 s doubling to 8 s), under the same name and worker id (a
worker re-registers as itself; the learner resumes from its last checkpoint), the coordinator
on the same port (workers were given its URL) and always with `--resume` (it restores its
snapshot from storage). After `--max-restarts` restarts of one child, or the same error
`SAME_CRASH_LIMIT` times from any, the run ends as crashed.

The stop goes workers first, so they can leave cleanly while the coordinator still takes what
they deliver, then the coordinator. A stop signal (Ctrl-C, SIGTERM, a closed terminal) only
asks for that stop (`StopSignals`): the watch loop sees it and ends the run in order.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rlfleet.local.children import Child, ChildFailed, start_child
from rlfleet.local.progress import Say
from rlfleet.ports import free_port
from rlfleet.shared.infra.crash import signature
from rlfleet.shared.infra.http import HttpClient, HttpError
from rlfleet.stopping import StopSignals as StopSignals  # the launcher's, re-exported

# Restart back-off per child: the first restart waits this long, each next one twice as long.
RESTART_DELAY_S = 0.5
MAX_RESTART_DELAY_S = 8.0
# The same error (where, type, message) this many times, from any child: the run ends.
SAME_CRASH_LIMIT = 3


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
    """A coordinator, its learners and its collectors as children of this process, each
    logging to <run-dir>/logs/<name>.log."""

    def __init__(self, config_path: Path, run_dir: Path, storage: str,
                 collector_nice: int = 0, resume: bool = False, max_restarts: int = 0,
                 fork: bool = False) -> None:
        self.collector_nice = collector_nice
        # Fork children from this process while it can (`services/local/forking.py`): only a
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
        # Per child, across its restarts: a learner's LOCAL_RANK, which puts learner i of a
        # machine with several GPUs on its own (`learner.device: cuda`).
        self._child_env: dict[str, dict[str, str]] = {}

    def _launch(self, name: str, role: str, args: list[str], port: int, nice: int = 0) -> Child:
        env = {**self.env, **self._child_env.get(name, {})}
        return start_child(name, role, args, port, log_dir=self.log_dir, env=env,
                           nice=nice, fork=self.fork)

    def _spawn(self, name: str, role: str, args: list[str], port: int, nice: int = 0) -> Child:
        child = self._launch(name, role, args, port, nice)
        self.children.append(child)
        return child

    def start(self, learners: int, collectors: int, port: int | None = None) -> None:
        """Every child at once, without waiting for the coordinator: workers register as soon
        as it answers. An offline run (no collectors) gets an evaluator, an env to evaluate
        in. Children started later (restarts, scaling) exec: a fresh process for a crashed
        one, and this process will hold connections and, with the progress display, a
        thread."""
        self.start_coordinator(wait=False, port=port)
        for _ in range(learners):
            self.add_learner()
        for _ in range(collectors):
            self.add_collector()
        if collectors == 0:
            self.add_evaluator()
        self.fork = False

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
        self._child_env[name] = {"LOCAL_RANK": str(self._learner_seq - 1)}
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

    # -- scaling ----------------------------------------------------------------------------

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

    # -- stopping ---------------------------------------------------------------------------

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


def supervise(cluster: LocalCluster, say: Say) -> None:
    """Restart whatever crashed (raises `RestartsExhausted` past the limit)."""
    for restart in cluster.restart_crashed():
        say(f"[yellow]{restart}[/]")


def scale(cluster: LocalCluster, status: dict, say: Say) -> None:
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


def crash_report(err: ChildFailed, max_restarts: int, escape: Callable[[str], str]) -> str:
    """The console's account (rich markup; `escape` makes text safe in it) of the failure
    that ends a run: the error, and for a child that exhausted its restarts, the last lines
    of its log."""
    if not isinstance(err, RestartsExhausted):
        return f"[red]{escape(str(err))}[/]"
    limit = "" if isinstance(err, SameCrash) else f" (--max-restarts {max_restarts})"
    return (f"[red]{escape(str(err))}[/]{limit}; last lines of {err.child.log_path}:\n"
            f"{escape(err.child.tail())}")
