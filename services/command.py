"""What every `rlfleet` command shares, whichever module defines it (`cli.py`, `roles.py`):
options that fall back to `RLFLEET_<OPTION>` variables, logging to stderr, the check of the
environment before anything starts, and how an error ends the process. A forked child runs its
role through `run` just as an exec'd one does through `rlfleet.cli.main`, so both exit alike.
"""

from __future__ import annotations

import argparse
import os
import sys

from rlfleet.shared.contract.config import ConfigError

# Commands that serve or call the HTTP API, and those that serve it.
HTTP_COMMANDS = {"coordinator", "collector", "learner", "up", "resume", "status", "scaler"}
SERVING_COMMANDS = {"coordinator", "collector", "learner", "up", "resume"}


def env(name: str, default=None):
    """An option's default from `RLFLEET_<name>`: how compose and Kubernetes configure a
    container, which runs the same command as a local process."""
    return os.environ.get(f"RLFLEET_{name}", default)


def setup_logging(role: str) -> None:
    from rlfleet.shared.infra.storage.credentials import log_to_stderr

    log_to_stderr(env("LOG_LEVEL", "INFO"), f"%(asctime)s {role} %(levelname)s %(name)s: "
                  "%(message)s")


def check_environment(command: str) -> None:
    """Fail before anything starts (exit 2, one line) on a token or body-limit setting that
    would otherwise fail inside the served app or a child process, as a traceback."""
    from rlfleet.shared.infra.auth import load_token
    from rlfleet.shared.infra.webapp import max_body_bytes

    if command in HTTP_COMMANDS:
        load_token()
    if command in SERVING_COMMANDS:
        max_body_bytes()


def run(args: argparse.Namespace) -> int:
    """Run a parsed command (`args.func`); its exit code. A `ConfigError` is the user's to
    mend: one line and exit 2, no traceback. Any error is recorded for the supervisor that
    started this process before it ends it."""
    try:
        check_environment(args.command)
        return args.func(args)
    except ConfigError as err:
        print(f"rlfleet {args.command}: {err}", file=sys.stderr)
        record_crash(err, args.command)
        return 2
    except Exception as err:
        record_crash(err, args.command)
        raise


def record_crash(err: BaseException, command: str) -> None:
    """A role that dies of an error says why to its supervisor (`shared/infra/crash.py`)."""
    from rlfleet.shared.infra.crash import write_crash

    write_crash(err, command, "start-up")
