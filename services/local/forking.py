"""Starting a role in a forked copy of the launcher, the way a preforking web server
preloads its app and Sample Factory's workers start: what the role imports is imported once,
in the launcher, and every child begins with it in memory.

Why: on a small machine a cluster's start is a fight for the cores. An exec'd `python -m
rlfleet <role>` child pays the interpreter's start, its imports (Flask, pydantic, numpy,
gymnasium, requests) and the config's parse again, all at once with the others and with the
learner's torch import, which delays the coordinator's first answer and the first chunk
(bench/RESULTS.md, "Time to the first chunk"). A fork costs milliseconds, the imports are
paid once, and the children share those pages copy-on-write (`gc.freeze` keeps the collector
from touching them).

Forking is only safe while the launcher has no other thread (a lock held by a thread that
does not exist in the child stays held for ever) and has never run a torch operation (whose
thread pools do not survive a fork): `can_fork` says so, and otherwise the caller starts
the child with exec. torch itself is imported here, once, before the first learner or
collector is forked (after the coordinator, which never needs it): importing it starts no
thread and runs no operation, and it is the largest import of all (about 1.8 CPU-seconds
on a small machine), which every learner and collector would otherwise pay again, all at
once and beside each other on the same cores.

So the first children of `rlfleet up` are forked; restarts and scaling, which happen while
the progress display's thread runs, exec. Both run the same command: an exec'd child
through `rlfleet.cli.main`, a forked one through `rlfleet.roles.main`, which has the same
parsers for the roles and ends the same way (`services/command.py`), and which needs
neither the rest of the CLI nor the launcher. In `ps` a forked child is titled
`rlfleet <role> ...` (setproctitle), an exec'd one `python -m rlfleet <role> ...`.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib
import io
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from rlfleet import roles

# What each role imports before it serves. A learner and a collector need torch too: it is
# imported here only as a module (`preload_torch`), never used.
PRELOAD: dict[str, tuple[str, ...]] = {
    "coordinator": ("rlfleet.coordinator.app", "rlfleet.serve", "rlfleet.http_errors",
                    "cheroot.wsgi"),
    "collector": ("rlfleet.collector.service", "rlfleet.shared.worker", "rlfleet.serve",
                  "rlfleet.http_errors", "cheroot.wsgi"),
    "learner": ("rlfleet.shared.worker", "rlfleet.serve", "rlfleet.http_errors", "cheroot.wsgi"),
}
TORCH_ROLES = ("collector", "learner")

# Whether torch is in this process only because `preload_torch` imported it: then no torch
# operation has run here (the launcher never runs one), so no thread pool exists to be lost
# in a fork. torch imported any other way (a user's env module, say) may have run one.
_torch_preloaded = False


def role_in(cmdline: list[str]) -> str | None:
    """The rlfleet command a process runs, from its command line: the word after `rlfleet`
    (an exec'd child, `python -m rlfleet <role> ...`; the console script; or a forked child's
    title `rlfleet <role> ...`, which is one string: split it first). None for anything
    else."""
    for i, arg in enumerate(cmdline[:-1]):
        if arg == "rlfleet" or Path(arg).name == "rlfleet":
            return cmdline[i + 1]
    return None


def can_fork() -> bool:
    """Whether a fork of this process gives a sound child: Linux, no thread but this one, and
    no torch but the one `preload_torch` imported (unused). Only Linux: on macOS a fork
    after numpy or any system framework has loaded may crash or hang the child (Apple's
    libraries are not fork-safe, and Python's multiprocessing spawns there for that
    reason), so children are exec'd there."""
    return (sys.platform == "linux" and hasattr(os, "fork")
            and threading.active_count() == 1
            and ("torch" not in sys.modules or _torch_preloaded))


def preload(role: str) -> None:
    """Import what `role` needs (once: imports are cached). An import that fails here is left
    to the child, which reports it in its log as an exec'd one would. The env's module is
    already here: the launcher checked the config by making the env."""
    for module in PRELOAD.get(role, ()):
        try:
            importlib.import_module(module)
        except Exception:  # the child imports it again and says why it fails
            return
    if role in TORCH_ROLES:
        preload_torch()


def preload_torch() -> None:
    """Import torch for the children to come, where that leaves forking sound: nothing has
    imported it yet (so nothing has run an operation). A failed import is left to the
    children, exec'd from then on (what it left in `sys.modules` is not `_torch_preloaded`),
    which say why in their logs."""
    global _torch_preloaded
    if "torch" in sys.modules or not can_fork():
        return
    try:
        importlib.import_module("torch")
    except Exception:
        return
    _torch_preloaded = True


class ForkedChild:
    """`subprocess.Popen`'s interface (what the launcher uses of it) for a forked child."""

    def __init__(self, pid: int, args: list[str]) -> None:
        self.pid = pid
        self.args = args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: its status is lost
                self.returncode = -1
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.0005
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def fork_role(argv: list[str], log_path: Path, env: dict[str, str],
              setup: Callable[[], None],
              main: Callable[[list[str]], int] = roles.main) -> ForkedChild:
    """Run `rlfleet <argv>` in a forked child whose output goes to `log_path` (appended) and
    whose environment is `env`; `setup` runs first in the child, as Popen's `preexec_fn`.
    `main` runs the command: a role's (`roles.main`) unless another command's is given."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    gc.freeze()  # what exists now is never scanned by the child's collector: pages stay shared
    pid = os.fork()
    if pid:
        return ForkedChild(pid, argv)
    code = 1
    try:
        _become_child(argv, log_path, env, setup)
        code = main(argv)
    except SystemExit as err:
        code = err.code if isinstance(err.code, int) else (0 if err.code is None else 1)
    except BaseException:  # the child must never return into the launcher
        traceback.print_exc()
    finally:
        code = _exit_code_after_shutdown(code)
        os._exit(code)
    raise AssertionError("unreachable")  # pragma: no cover


def _become_child(argv: list[str], log_path: Path, env: dict[str, str],
                  setup: Callable[[], None]) -> None:
    """Turn the fresh fork into what an exec'd `python -m rlfleet <argv>` would be."""
    setup()
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    atexit._clear()  # the launcher's exit work is not the child's
    devnull = os.open(os.devnull, os.O_RDONLY)
    log_fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(devnull, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(devnull)
    os.close(log_fd)
    # Unbuffered, as PYTHONUNBUFFERED makes an exec'd child's streams.
    sys.stdin = open(0, closefd=False)  # noqa: SIM115
    sys.stdout = io.TextIOWrapper(open(1, "wb", buffering=0, closefd=False),  # noqa: SIM115
                                  write_through=True, line_buffering=True)
    sys.stderr = io.TextIOWrapper(open(2, "wb", buffering=0, closefd=False),  # noqa: SIM115
                                  write_through=True, line_buffering=True)
    # The title first: setproctitle finds the memory it rewrites through the environment.
    _set_title(["rlfleet", *argv])
    os.environ.clear()
    os.environ.update(env)
    logging.root.handlers.clear()  # the role sets up its own
    sys.argv = ["rlfleet", *argv]
    random.seed()


def _set_title(cmd: list[str]) -> None:
    """Name the role in the command line `ps`, psutil and bench/footprint.py read. SPT_NOENV:
    /proc/<pid>/environ stays as it was (tools find a run's processes by it); the title is
    then cut to the length of the launcher's own command line."""
    os.environ["SPT_NOENV"] = "1"
    try:
        from setproctitle import setproctitle
    except ImportError:
        return
    setproctitle(" ".join(cmd))


def _exit_code_after_shutdown(code: int) -> int:
    """What the interpreter does at exit, for a child that leaves with `os._exit`: wait for
    its non-daemon threads, run its own atexit work, flush its streams."""
    try:
        # private, and so not in typeshed: as multiprocessing's children do
        threading._shutdown()  # type: ignore[attr-defined]
        atexit._run_exitfuncs()
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
    except BaseException:  # whatever it is, the child exits
        traceback.print_exc()
        return code or 1
    return code
