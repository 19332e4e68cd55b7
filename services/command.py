"""What every `rlfleet` command shares, whichever module defines it (`cli.py`, `roles.py`):
options that fall back to `RLFLEET_<OPTION>` variables, logging to stderr, the check of the
environment before anything starts, and how an error ends the process. A forked child runs its
role through `run` just as an exec'd one does through `rlfleet.cli.main`, so both exit alike.

A variable is read as the parser is built but converted only when the command that uses it is
parsed: its text is the option's default, which argparse converts with the option's `type`
for the sub-command on the command line alone. So `RLFLEET_PORT=8k rlfleet status` runs (status
has no port), and `RLFLEET_PORT=8k rlfleet coordinator` is a usage error naming `RLFLEET_PORT`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, Self, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from rlfleet.shared.contract.config import ConfigError

T = TypeVar("T")

# Commands that serve or call the HTTP API, and those that serve it.
HTTP_COMMANDS = {"coordinator", "collector", "learner", "up", "resume", "status", "scaler",
                 "slurm"}
SERVING_COMMANDS = {"coordinator", "collector", "learner", "up", "resume", "slurm"}
# Commands that open the run's storage (`up` and `resume` through their children), and those
# that log through `setup_logging` (again with `up`'s children).
STORAGE_COMMANDS = {"coordinator", "collector", "learner", "up", "resume", "slurm"}
LOGGING_COMMANDS = {"coordinator", "collector", "learner", "up", "resume", "single",
                    "serve-policy", "scaler", "slurm"}
# Dotted config overrides for `rlfleet coordinator` (what compose and Kubernetes run), as one
# shell-quoted string: applied before those on its command line.
OVERRIDES_ENV = "RLFLEET_OVERRIDES"
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class EnvText(str):
    """An option's default as an `RLFLEET_*` variable holds it: text, so that argparse converts
    it (with the option's `type`) only for the sub-command being parsed, and which remembers
    its variable, so that a value the type refuses is reported by the variable's name."""

    variable: str

    def __new__(cls, text: str, variable: str) -> EnvText:
        self = super().__new__(cls, text)
        self.variable = variable
        return self


def env(name: str, default: Any = None) -> Any:
    """An option's default from `RLFLEET_<name>`: how compose and Kubernetes configure a
    container, which runs the same command as a local process. Unconverted (`EnvText`): give
    the option a `type` made by `from_env` (or `EnvFlag` for a switch)."""
    raw = os.environ.get(f"RLFLEET_{name}")
    return default if raw is None else EnvText(raw, f"RLFLEET_{name}")


def from_env(convert: Callable[[str], T], expected: str) -> Callable[[str], T]:
    """An argparse `type` that converts with `convert`: a value from the command line that
    fails gets argparse's usual message (`invalid int value: '8k'`), one from a variable a
    message naming the variable and what it should hold (`RLFLEET_PORT='8k': expected an
    integer`). Both are usage errors (exit 2)."""

    def parse(text: str) -> T:
        try:
            return convert(text)
        except (TypeError, ValueError, argparse.ArgumentTypeError) as err:
            if not isinstance(text, EnvText):
                raise
            why = str(err) if isinstance(err, argparse.ArgumentTypeError) else ""
            raise argparse.ArgumentTypeError(
                f"{text.variable}={str(text)!r}: expected {expected}"
                + (f" ({why})" if why else "")) from None

    parse.__name__ = getattr(convert, "__name__", "value")  # argparse's "invalid int value"
    return parse


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0 to 65535, not {value}")
    return value


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {value}")
    return value


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {value}")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if not value >= 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {text}")
    return value


def _switch(text: str) -> bool:
    word = text.strip().lower()
    if word in ("1", "true", "yes", "on"):
        return True
    if word in ("", "0", "false", "no", "off"):
        return False
    raise ValueError(word)


_port.__name__ = _positive.__name__ = _non_negative.__name__ = "int"
_seconds.__name__ = "float"

INT = from_env(int, "an integer")
FLOAT = from_env(float, "a number")
PORT = from_env(_port, "a port number (0 to 65535)")
POSITIVE = from_env(_positive, "a whole number, 1 or more")
NON_NEGATIVE = from_env(_non_negative, "a whole number, 0 or more")
SECONDS = from_env(_seconds, "a number of seconds, 0 or more")
SWITCH = from_env(_switch, "1 or 0 (or true/false, yes/no, on/off)")


class EnvFlag(argparse.Action):
    """A switch (`--resume`) whose default comes from an `RLFLEET_*` variable, as `env(NAME,
    False)` gives it: 1, true, yes or on set it, 0, false, no, off or empty leave it off, and
    anything else is a usage error naming the variable (rather than a silent "off")."""

    def __init__(self, option_strings: Sequence[str], dest: str, default: Any = False,
                 required: bool = False, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=default, type=SWITCH,
                         required=required, help=help)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, True)


class CommandOptions(BaseModel):
    """A long command's options as one typed, frozen object: what its handler takes, whether
    the command line built it from parsed options or the Python API from keyword arguments,
    and what the API hands its child process (as JSON: `rlfleet.api_child`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @classmethod
    def checked(cls, **fields: Any) -> Self:
        """The options from `fields`; a value the model refuses raises `ConfigError` naming
        the field (`collectors='x': ...`), before anything starts."""
        try:
            return cls(**fields)
        except ValidationError as err:
            raise ConfigError(options_error(err)) from None


def options_error(err: ValidationError) -> str:
    """A refused option, one line per problem: `field=value: why`, or, for a rule across
    fields, its message (which names the field)."""
    lines = []
    for e in err.errors():
        msg = e["msg"].removeprefix("Value error, ")
        loc = ".".join(str(p) for p in e["loc"])
        lines.append(f"{loc}={e.get('input')!r}: {msg}" if loc else msg)
    return "\n".join(lines)


def parse_command(parser: argparse.ArgumentParser, argv: Sequence[str] | None
                  ) -> argparse.Namespace:
    """`parser.parse_args(argv)`, with a command's `KEY=VALUE` overrides anywhere after its
    options: argparse gives a positional of `nargs="*"` only the items of its first run
    between options (`rlfleet resume RUN_DIR --max-env-steps 9 algo.lr=1e-4` would leave
    `algo.lr=1e-4` unrecognized). What is left that is not an option joins the overrides,
    where a malformed item is named; anything else is argparse's usual error."""
    args, extras = parser.parse_known_args(argv)
    if extras and hasattr(args, "overrides") and not any(e.startswith("-") for e in extras):
        args.overrides = [*(args.overrides or ()), *extras]
    elif extras:
        parser.error(f"unrecognized arguments: {' '.join(extras)}")
    return args


def log_level() -> str:
    """`RLFLEET_LOG_LEVEL` (INFO unless set): a level name as `logging` knows it, in capitals
    (every process of a run reads it, a learner's data process too). Raises `ConfigError`
    naming the variable."""
    import logging

    level = os.environ.get("RLFLEET_LOG_LEVEL", "INFO")
    if level not in logging.getLevelNamesMapping():
        raise ConfigError(f"RLFLEET_LOG_LEVEL={level!r}: expected one of "
                          f"{', '.join(LOG_LEVELS)}")
    return level


def setup_logging(role: str) -> None:
    from rlfleet.shared.infra.storage.credentials import log_to_stderr

    log_to_stderr(log_level(), f"%(asctime)s {role} %(levelname)s %(name)s: "
                  "%(message)s")


def check_environment(command: str) -> None:
    """Fail before anything starts (exit 2, one line naming the variable) on an `RLFLEET_*`
    setting the command uses that would otherwise fail inside the served app, a background
    thread or a child process, as a traceback: the token, the body limit, the log level, the
    storage's retry time and password file. A command that does not use a setting never
    reads it."""
    from rlfleet.shared.infra.auth import load_token
    from rlfleet.shared.infra.webapp import max_body_bytes

    if command in HTTP_COMMANDS:
        load_token()
    if command in SERVING_COMMANDS:
        max_body_bytes()
    if command in LOGGING_COMMANDS:
        log_level()
    if command in STORAGE_COMMANDS:
        from rlfleet.shared.infra.storage import RETRY_ENV, storage_retry_s
        from rlfleet.shared.infra.storage.credentials import configured_password

        if os.environ.get(RETRY_ENV, "").strip():  # unset: no need to import redis for it
            storage_retry_s()
        configured_password()


def run(args: argparse.Namespace) -> int:
    """Run a parsed command (`args.func`); its exit code, as `run_command` gives it."""
    return run_command(args.command, lambda: args.func(args))


def run_command(command: str, start: Callable[[], int]) -> int:
    """Run `command` (`start` runs it: from a parsed command line, or from the options the
    Python API handed its child); its exit code. A `ConfigError` is the user's to mend: one
    line and exit 2, no traceback. Any error is recorded for the supervisor that started this
    process before it ends it."""
    try:
        check_environment(command)
        return start()
    except ConfigError as err:
        print(f"rlfleet {command}: {err}", file=sys.stderr)
        record_crash(err, command)
        return 2
    except Exception as err:
        record_crash(err, command)
        raise


def record_crash(err: BaseException, command: str) -> None:
    """A role that dies of an error says why to its supervisor (`shared/infra/crash.py`)."""
    from rlfleet.shared.infra.crash import write_crash

    write_crash(err, command, "start-up")
