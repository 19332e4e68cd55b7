"""gunicorn's config for the coordinator (`rlfleet.wsgi`):

    gunicorn -c python:rlfleet.gunicorn_conf 'rlfleet.wsgi:coordinator_app()'

The coordinator keeps its run in memory (buffers' indexes, tasks, members, counters), so it is
one process: one gunicorn worker, whose threads serve concurrent requests (`gthread`, as many
as `RLFLEET_THREADS`, 16 unless set). A second worker would be a second coordinator of the same
run, so any other number of workers (`-w`, `GUNICORN_CMD_ARGS`, `WEB_CONCURRENCY`, `SIGTTIN`) is
refused, as is anything else that would boot a second coordinator beside the first or after it
(`max_requests`, `reload`, `preload_app`).

The arbiter checks the settings before any worker starts (`on_starting`): a mistake is one line
naming it and exit 2, as `rlfleet coordinator` says it. The worker builds the app and starts the
coordinator's service (`post_worker_init`); SIGTERM to gunicorn stops taking requests, lets
those in flight finish (within `graceful_timeout`), closes the service (its final snapshot) in
`worker_exit` and exits 0, as the in-process server does. A worker that ends while gunicorn
serves (the service's fatal error, a crash, a hung worker gunicorn killed) ends gunicorn with
exit 1 (`child_exit`) instead of having it boot a fresh coordinator beside the run's storage:
the supervisor restarts the whole server, which with `RLFLEET_RESUME=1` restores the run.

Everything below can still be changed on gunicorn's command line (`--threads`, `--bind`,
`--timeout`, ...), except the refused settings above.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from typing import Any

log = logging.getLogger("rlfleet.gunicorn")


def _env_int(name: str, default: int) -> int:
    """A number from the environment for a setting gunicorn reads as this module loads; a bad
    value falls back to `default` here and is refused by `on_starting`, naming the variable,
    rather than failing the import with a traceback."""
    raw = os.environ.get(name, "").strip()
    return int(raw) if raw.isdigit() else default


# -- serving ---------------------------------------------------------------------------------

bind = [f"{os.environ.get('RLFLEET_HOST', '127.0.0.1')}:{_env_int('RLFLEET_PORT', 8000)}"]
worker_class = "gthread"
threads = _env_int("RLFLEET_THREADS", 16)
# `workers` is gunicorn's default: 1, or WEB_CONCURRENCY, which `on_starting` refuses if not 1.

# The longest request the coordinator answers is a long poll (a learner's `POST /sample`, a
# collector's `POST /permits/collect`) of at most 30 s (`wait_s`, contract/wire); its own clients
# wait 1 s. `timeout` is how long the worker's main loop may go silent before gunicorn kills it;
# gthread's loop speaks every second whatever its threads do, so this catches a hung worker.
timeout = 60
# SIGTERM: requests in flight get this long to finish, then the service closes (final snapshot).
# The container's stop grace (compose `stop_grace_period`, Kubernetes
# `terminationGracePeriodSeconds`) must be longer.
graceful_timeout = 30
# Workers keep one connection to the coordinator and call it every second or so: keep it open
# as long as the in-process server does (cheroot's 30 s).
keepalive = 30

# The request line and headers, bounded as the in-process server bounds them together (64 KiB,
# services/http_errors.py) as closely as gunicorn's limits allow: a line of up to 8190 bytes
# (its most), and 100 headers of up to 8190 bytes each. Nothing of ours sends more than a few
# hundred bytes; bodies are the app's to limit (RLFLEET_MAX_BODY_BYTES). Unlike the in-process
# server's, gunicorn's own answers to a request it cannot parse are not JSON.
limit_request_line = 8190
limit_request_fields = 100
limit_request_field_size = 8190

accesslog = "-"  # stdout
errorlog = "-"   # stderr
loglevel = os.environ.get("RLFLEET_LOG_LEVEL", "info").lower()
proc_name = "rlfleet-coordinator"
# The worker's heartbeat file: in memory where there is /dev/shm (a container's disk may stall).
worker_tmp_dir = "/dev/shm" if os.path.isdir("/dev/shm") else None
preload_app = False  # the coordinator is built in the worker, never in the arbiter
# gunicorn's control socket (`gunicornc`) adds and removes workers and reloads: none of which
# the coordinator can do. Signals remain (TERM, and INT or QUIT for a quick stop).
control_socket_disable = True

# Settings under which gunicorn would run a second coordinator of the run, beside or after the
# first: each with the value it must keep and why.
REQUIRED: dict[str, tuple[Any, str]] = {
    "workers": (1, "the coordinator keeps its run in memory, so a second worker would be a "
                   "second coordinator; serve more requests at once with threads "
                   "(RLFLEET_THREADS or --threads)"),
    "max_requests": (0, "a worker restarted after N requests would be a fresh coordinator"),
    "reload": (False, "a reloaded worker would be a fresh coordinator"),
    "preload_app": (False, "the coordinator must be built in the worker that serves it"),
}
SOURCES = {"workers": "-w/--workers, GUNICORN_CMD_ARGS or WEB_CONCURRENCY"}


class SettingError(Exception):
    """A gunicorn setting the coordinator cannot run under; the message names it."""


def check_numbers() -> None:
    """The variables this module reads as numbers: a bad one is named, not a traceback."""
    for name, least in (("RLFLEET_PORT", 0), ("RLFLEET_THREADS", 1)):
        raw = os.environ.get(name)
        if raw is not None and not (raw.strip().isdigit() and int(raw) >= least):
            raise SettingError(f"{name}={raw!r}: expected a whole number of at least {least}")


def check_gunicorn(cfg) -> None:
    """Refuse gunicorn settings (`gunicorn.config.Config`) that would run a second
    coordinator: `SettingError` naming the setting, where it comes from, and why."""
    for name, (wanted, why) in REQUIRED.items():
        value = getattr(cfg, name)
        if value != wanted:
            source = f" (from {SOURCES[name]})" if name in SOURCES else ""
            raise SettingError(f"gunicorn {name}={value!r}{source}: it must be {wanted!r}; "
                               f"{why}")


# -- hooks: the arbiter ----------------------------------------------------------------------

def on_starting(server) -> None:
    """Before any socket or worker: the gunicorn settings, then the coordinator's own (its
    config, run directory, token) in a process of its own (`python -m rlfleet.wsgi`), so that
    the arbiter stays as small as gunicorn alone. Each mistake is one line and exit 2."""
    try:
        check_numbers()
        check_gunicorn(server.cfg)
    except SettingError as err:
        print(f"rlfleet coordinator: {err}", file=sys.stderr, flush=True)
        sys.exit(2)
    checked = subprocess.run([sys.executable, "-m", "rlfleet.wsgi"], check=False)
    if checked.returncode != 0:
        sys.exit(checked.returncode)


def nworkers_changed(server, new_value: int, old_value: int | None) -> None:
    """SIGTTIN asks for one more worker: a second coordinator. Keep one."""
    if old_value is not None and new_value != 1:
        server.log.error("refusing %d workers: the coordinator runs as one worker", new_value)
        server.num_workers = 1


def on_reload(server) -> None:
    """SIGHUP would boot a new worker beside the old one: two coordinators of the run at once.
    Stop instead (final snapshot, exit 0); the supervisor starts it again."""
    from gunicorn.errors import HaltServer

    raise HaltServer("SIGHUP: a reload would run a second coordinator beside this one; "
                     "stopping instead (restart gunicorn to reload)", 0)


def child_exit(server, worker) -> None:
    """A worker ended. While gunicorn still serves (its listeners open), nobody asked it to:
    end gunicorn with exit 1, so that the supervisor restarts the server, rather than let
    gunicorn boot a fresh coordinator with nothing in memory. During a stop the listeners are
    closed first, and the worker's end is the stop's."""
    from gunicorn.errors import HaltServer

    if server.LISTENERS:
        raise HaltServer(f"the coordinator's worker (pid {worker.pid}) ended while serving; "
                         "stopping so that the supervisor restarts the coordinator", 1)


# -- hooks: the worker -----------------------------------------------------------------------

_service = None  # the coordinator this worker started; None in the arbiter


def post_worker_init(worker) -> None:
    """The app is built: start the coordinator's service in this worker. A fatal error of the
    service stops the worker as SIGTERM does (its service closes), and `child_exit` then ends
    gunicorn with exit 1."""
    global _service
    service = worker.wsgi.extensions["rlfleet"]
    service.on_fatal = _stop_after_fatal
    service.start()
    _service = service


def _stop_after_fatal() -> None:
    log.error("the coordinator stopped after a fatal error")
    os.kill(os.getpid(), signal.SIGTERM)


def worker_exit(server, worker) -> None:
    """The worker's requests are done: close the service (the final snapshot)."""
    global _service
    service, _service = _service, None
    if service is not None:
        service.close()
