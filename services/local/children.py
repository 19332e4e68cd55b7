"""One child process of `rlfleet up`: how it starts (forked from the launcher while that is
safe, exec'd otherwise; `services/local/forking.py`), where its output goes, and what it said when
it died.

Every child gets a process group of its own (Ctrl-C reaches only the launcher, which then
stops them in order) and a parent-death signal (if the launcher is killed outright, its
children die with it: no orphans).
"""

from __future__ import annotations

import ctypes
import functools
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from rlfleet import roles
from rlfleet.local.forking import ForkedChild, can_fork, fork_role, preload
from rlfleet.shared.infra.crash import CRASH_FILE_ENV, read_crash

_PR_SET_PDEATHSIG = 1


def child_setup(nice: int) -> None:
    """Runs in the child right after the fork (before exec, or before the role's code)."""
    if nice:
        os.nice(nice)
    die_with_parent()


def die_with_parent() -> None:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass  # not Linux: Ctrl-C and normal exits still stop children
    # A process group of its own, so a terminal's Ctrl-C reaches the launcher only (which
    # stops the children in order), but not a session of its own: Linux's scheduler gives
    # every session (autogroup) an equal share of the CPU whatever its niceness, so with one
    # session per child a niced collector or torch import would take as much CPU as the
    # learner's training thread or the coordinator's start.
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


def start_child(name: str, role: str, args: list[str], port: int, *, log_dir: Path,
                env: dict[str, str], nice: int = 0, fork: bool = False) -> Child:
    """Start `rlfleet <role> --port <port> <args>`; its output goes to <log_dir>/<name>.log
    (appended, so a restarted child continues the same log). With `fork`, and while this
    process can fork soundly, it is a fork of this process; otherwise an exec."""
    log_path = log_dir / f"{name}.log"
    # Where it records the error it dies of; an older one is of a process now gone.
    crash_path = log_dir / f"{name}.crash.json"
    crash_path.unlink(missing_ok=True)
    env = {**env, CRASH_FILE_ENV: str(crash_path)}
    # The port and the worker id first: a forked child's title (its command line in
    # `ps`) is cut to the launcher's length, and these name it.
    argv = [role, "--port", str(port), *args]
    setup = functools.partial(child_setup, nice)
    if fork and can_fork():
        preload(role)
        return Child(name, role, fork_role(argv, log_path, env, setup, roles.main), log_path,
                     port, args, nice)
    log = open(log_path, "ab")  # noqa: SIM115 - handed to the child, closed at exit
    # No stdin: a child is in the terminal's session, in a background process group.
    proc = subprocess.Popen([sys.executable, "-m", "rlfleet", *argv],
                            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                            env=env, preexec_fn=setup, cwd=os.getcwd())
    log.close()
    return Child(name, role, proc, log_path, port, args, nice)
