"""The `rlfleet` command: one entry point for every process of a cluster.

    rlfleet coordinator --config PATH [--host H] [--port P] [KEY=VALUE ...]  # containers
    rlfleet collector --coordinator URL
    rlfleet learner --coordinator URL
    rlfleet up --config PATH [--collectors N] [--storage S] [--run-dir D] [--seed S]
               [--max-restarts N] [KEY=VALUE ...]              # restarts crashed children
    rlfleet resume RUN_DIR [KEY=VALUE ...]
    rlfleet status [--coordinator URL]
    rlfleet scaler --coordinator URL                          # compose: collectors as containers
    rlfleet single --config PATH [KEY=VALUE ...]               # no HTTP, no storage
    rlfleet battle RUN_DIR [--games N]                         # a self-play policy vs bots
    rlfleet play RUN_DIR [--episodes N] [--video out.mp4] [--stochastic] [--seed S]
                 [--checkpoint N]
    rlfleet serve-policy RUN_DIR --port P [--host H] [--threads N] [--reload-s S]  # POST /act
                 [--checkpoint N]
    rlfleet checkpoints RUN_DIR [--json]                       # a run's kept checkpoints
    rlfleet check --config PATH [KEY=VALUE ...]                # build its env and policy
    rlfleet buffer save RUN_DIR --buffer NAME --out FILE [--coordinator URL]
    rlfleet buffer load RUN_DIR --buffer NAME --in FILE [--coordinator URL]

`KEY=VALUE` items after the options change the config's fields (`algo.lr=3e-4
env.num_envs=16`, values in YAML; `shared/run/overrides.py`), checked as the file is.

The options of the roles and the services (coordinator, collector, learner, status, scale,
scaler, serve-policy) can also come from `RLFLEET_<OPTION>` environment variables (for example
`RLFLEET_COORDINATOR`, `RLFLEET_PORT`, `RLFLEET_STORAGE`, and `RLFLEET_OVERRIDES` for the
coordinator's `KEY=VALUE` items), which is how compose and Kubernetes configure containers. A
variable is converted only by a command that uses it, and a bad value is a usage error naming
it (`command.py`).

Two settings are environment-only, because they are secrets or concern every role alike:
`RLFLEET_TOKEN` (or `RLFLEET_TOKEN_FILE`), the cluster's shared API token that every service
requires and every client sends (`shared/infra/auth.py`), and `RLFLEET_MAX_BODY_BYTES`, the request
body limit of every service (`shared/infra/webapp.py`). `rlfleet up` passes both to its children.

Each group of sub-commands adds its own parsers beside the handlers they call
(`services/commands/`, `roles.py`, `slurm/submit.py`); `build_parser` adds every group's.
"""

from __future__ import annotations

import argparse
import sys

from rlfleet import roles
from rlfleet.command import parse_command, run
from rlfleet.commands import check, cluster, launch, runs, single
from rlfleet.ports import free_port as free_port  # benches import it from here
from rlfleet.slurm import submit as slurm

# What adds each group's sub-commands, in the order `rlfleet --help` lists them.
SUB_COMMANDS = (roles.add_role_parsers, launch.add_parser, runs.add_parser, cluster.add_parser,
                slurm.add_parser, check.add_parser, single.add_parser)


def _version() -> str:
    import rlfleet

    return rlfleet.__version__


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rlfleet", description=__doc__.split("\n")[0])
    p.add_argument("--version", action="version", version=f"rlfleet {_version()}")
    sub = p.add_subparsers(dest="command", required=True)
    for add in SUB_COMMANDS:
        add(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    return run(parse_command(build_parser(), argv))


if __name__ == "__main__":
    sys.exit(main())
