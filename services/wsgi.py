"""The coordinator as an app gunicorn serves, for operators who run Flask services behind it:

    gunicorn -c python:rlfleet.gunicorn_conf 'rlfleet.wsgi:coordinator_app()'

`coordinator_app` reads the settings `rlfleet coordinator` reads, from the same parser with no
command line (`RLFLEET_CONFIG`, `RLFLEET_STORAGE`, `RLFLEET_RUN_DIR`, `RLFLEET_RESUME`, ...), and
builds the very app the in-process server serves, its service not yet started: the shipped
config (`gunicorn_conf.py`) starts it in gunicorn's worker and closes it (the final snapshot)
when the worker exits. Before any worker starts, the config runs `python -m rlfleet.wsgi`, which
checks the settings (`check_settings`) and ends with one line and exit 2 on a mistake; a
process of its own, so that gunicorn's arbiter imports none of what the check needs (pydantic,
numpy: some 25 MB it would hold for the server's whole life).
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from rlfleet.command import check_environment, setup_logging
from rlfleet.roles import build_parser, coordinator_factory
from rlfleet.shared.contract.config import ConfigError

if TYPE_CHECKING:
    from collections.abc import Callable

    from flask import Flask

COMMAND = "coordinator"


def coordinator_args() -> argparse.Namespace:
    """`rlfleet coordinator`'s options with nothing on its command line: each from its
    `RLFLEET_*` variable or its default. A bad value ends the process as the CLI does (argparse's
    usage error, exit 2)."""
    return build_parser().parse_args([COMMAND])


def check_settings() -> Callable[[], Flask]:
    """Everything `rlfleet coordinator` checks before it serves (the token and body-limit
    variables, the run's config, its run directory); the app's factory. Raises `ConfigError`
    naming what to mend."""
    args = coordinator_args()
    check_environment(COMMAND)
    return coordinator_factory(args)


def coordinator_app() -> Flask:
    """gunicorn's app factory, called in its worker: the coordinator's app, its service not
    started (`gunicorn_conf.post_worker_init` starts it). A setting that fails here, although
    the arbiter checked it, is reported as gunicorn reports an app it cannot load: one line,
    and gunicorn stops (a worker that exits 2 would be booted again and again)."""
    from gunicorn.errors import AppImportError

    setup_logging(COMMAND)
    try:
        factory = check_settings()
    except ConfigError as err:
        raise AppImportError(f"rlfleet {COMMAND}: {err}") from None
    except SystemExit as err:  # argparse has said why on stderr
        raise AppImportError(f"rlfleet {COMMAND}: bad settings (exit {err.code})") from None
    return factory()


def main() -> int:
    """`python -m rlfleet.wsgi`: check the settings as `rlfleet coordinator` would, serving
    nothing; 0, or one line naming what to mend and 2."""
    try:
        check_settings()
    except ConfigError as err:
        print(f"rlfleet {COMMAND}: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
