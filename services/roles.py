"""The commands a cluster's processes run: `rlfleet coordinator`, `rlfleet collector`,
`rlfleet learner`. A container runs them through the `rlfleet` command (`cli.py`, which adds
these parsers to its own); a child of `rlfleet up` runs them through `main` here, forked from
the launcher (`local/forking.py`) or exec'd. This module imports neither the launcher nor the rest
of the CLI: a forked child needs only its role, and the launcher needs this module to fork it.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from rlfleet.command import (
    OVERRIDES_ENV,
    PORT,
    POSITIVE,
    EnvFlag,
    env,
    from_env,
    parse_command,
    run,
    setup_logging,
)
from rlfleet.ports import free_port
from rlfleet.shared.contract.config import ConfigError
from rlfleet.shared.run.config import load_config

if TYPE_CHECKING:
    from flask import Flask

    from rlfleet.shared.worker import WorkerService

log = logging.getLogger("rlfleet.coordinator")

OVERRIDES_HELP = ("config fields to change, as dotted KEY=VALUE items after the options, "
                  "each value YAML: algo.lr=3e-4 env.num_envs=16 "
                  "'learner.mix=[{buffer: replay, fraction: 1.0}]'")


def _advertise(args: argparse.Namespace) -> str:
    if args.advertise_url:
        return args.advertise_url
    host = args.host if args.host not in ("0.0.0.0", "::", "") else socket.gethostname()
    return f"http://{host}:{args.port}"


def coordinator_factory(args: argparse.Namespace) -> Callable[[], Flask]:
    """What `rlfleet coordinator` serves, from its parsed options: the run's config (with the
    overrides of `RLFLEET_OVERRIDES` and then of the command line, and the command line's seed,
    name and networks), its run directory and storage, checked now, and a factory that builds
    the coordinator's app (not yet started). The in-process server and the gunicorn entry
    point (`rlfleet.wsgi`) serve the same app."""
    if not args.config:
        raise ConfigError("coordinator needs --config PATH (or RLFLEET_CONFIG)")
    overrides = env_overrides() + list(getattr(args, "overrides", None) or ())
    cfg = load_config(args.config, overrides)
    if overrides:
        log.info("config %s with overrides: %s", args.config, " ".join(overrides))
    cfg = cfg.with_overrides(seed=args.seed, name=args.name)
    if args.worker_networks is not None:  # a deployment's own networks (compose, k8s)
        networks = [n for n in args.worker_networks.split(",") if n.strip()]
        cfg = cfg.with_overrides(coordinator={**cfg.coordinator.model_dump(),
                                              "worker_networks": networks})
    run_dir = Path(args.run_dir or Path("runs") / cfg.name)
    storage = args.storage or cfg.storage or str(run_dir / "storage")
    run_dir.mkdir(parents=True, exist_ok=True)

    def factory() -> Flask:
        from rlfleet.coordinator.app import create_app

        return create_app(cfg, storage, run_dir, start=False, resume=args.resume)

    return factory


def env_overrides() -> list[str]:
    """The `key=value` items of `RLFLEET_OVERRIDES`, split as a shell splits them (so a
    value with spaces is quoted: `RLFLEET_OVERRIDES="algo.lr=3e-4 'learner.mix=[{buffer:
    replay, fraction: 1.0}]'"`). A container's command stays the image's, and an operator
    sets the run's overrides beside its other `RLFLEET_*` settings."""
    import shlex

    raw = os.environ.get(OVERRIDES_ENV, "")
    try:
        items = shlex.split(raw)
    except ValueError as err:
        raise ConfigError(f"{OVERRIDES_ENV}={raw!r}: cannot split it as a shell would: "
                          f"{err}") from None
    for item in items:
        if "=" not in item:
            raise ConfigError(f"{OVERRIDES_ENV}: {item!r} is not KEY=VALUE (for example "
                              "algo.lr=3e-4; quote a value with spaces)")
    return items


def cmd_coordinator(args: argparse.Namespace) -> int:
    from rlfleet.serve import serve_in_process

    setup_logging("coordinator")
    factory = coordinator_factory(args)
    # One process, as the workers are: the app keeps its state in this process, so a second
    # one beside it would buy nothing and cost memory.
    return serve_in_process(factory, args.host, args.port, threads=args.threads)


def serve_worker(args: argparse.Namespace, role: str) -> int:
    """Serve a collector or a learner from this one process (`services/serve.py`). The role's
    module is imported here, after the arguments are checked: a collector's imports leave torch
    to a background thread (it acts before torch has loaded where its algorithm allows)."""
    setup_logging(role)
    if not args.coordinator:
        raise ConfigError(f"{role} needs --coordinator URL (or RLFLEET_COORDINATOR)")
    if not args.port:
        args.port = free_port(args.host if args.host != "0.0.0.0" else "127.0.0.1")
    service_class: type[WorkerService]
    if role == "collector":
        from rlfleet.collector.service import CollectorService

        service_class = CollectorService
    else:  # first, so that everything it imports (Flask, pydantic, torch) is imported nicer
        from rlfleet.shared.infra.priority import import_nicer

        service_class = import_nicer("rlfleet.learner.service", "LearnerService")
    from rlfleet.serve import serve_in_process
    from rlfleet.shared.worker import create_worker_app

    def factory():
        service = service_class(args.coordinator, _advertise(args), args.worker_id,
                                args.storage)
        if getattr(args, "evaluate_only", False):
            service.evaluate_only = True
        return create_worker_app(service)

    return serve_in_process(factory, args.host, args.port, threads=4)


def add_role_parsers(sub: argparse._SubParsersAction) -> None:
    """The three roles' sub-commands, with their `RLFLEET_*` defaults."""
    c = sub.add_parser("coordinator", help="serve the coordinator (one process: the Flask app "
                       "on a cheroot thread pool)")
    c.add_argument("--config", default=env("CONFIG"))
    c.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                   help=OVERRIDES_HELP + f"; applied after those of {OVERRIDES_ENV} (one "
                   "shell-quoted string of them, for compose and Kubernetes)")
    c.add_argument("--host", default=env("HOST", "127.0.0.1"))
    c.add_argument("--port", type=PORT, default=env("PORT", "8000"))
    c.add_argument("--storage", default=env("STORAGE"), help="directory or redis://host:port/db")
    c.add_argument("--run-dir", default=env("RUN_DIR"))
    c.add_argument("--seed", type=from_env(int, "an integer seed"), default=env("SEED"))
    c.add_argument("--name", default=env("RUN_NAME"), help="run name (storage namespace)")
    c.add_argument("--threads", type=POSITIVE, default=env("THREADS", "16"))
    c.add_argument("--resume", action=EnvFlag, default=env("RESUME", False),
                   help="continue from the buffers and counters snapshot in storage")
    c.add_argument("--worker-networks", default=env("WORKER_NETWORKS"),
                   help="comma-separated CIDRs workers must register from (replaces the "
                        "config's coordinator.worker_networks)")
    c.set_defaults(func=cmd_coordinator)

    for role in ("collector", "learner"):
        w = sub.add_parser(role, help=f"serve a {role} that joins a coordinator (one process: "
                           "its HTTP endpoint is a thread pool beside the role's loop)")
        w.add_argument("--coordinator", default=env("COORDINATOR"))
        w.add_argument("--host", default=env("HOST", "127.0.0.1"))
        w.add_argument("--port", type=PORT, default=env("PORT", "0"))
        w.add_argument("--advertise-url", default=env("ADVERTISE_URL"),
                       help="URL the coordinator uses to reach this worker")
        w.add_argument("--worker-id", default=env("WORKER_ID"))
        w.add_argument("--storage", default=env("STORAGE"),
                       help="override the storage the coordinator announces")
        if role == "collector":
            w.add_argument("--evaluate-only", action=EnvFlag,
                           default=env("EVALUATE_ONLY", False),
                           help="collect nothing, only run the evaluations the coordinator "
                           "sends (an offline run's evaluator)")
        w.set_defaults(func=lambda a, r=role: serve_worker(a, r))


def build_parser() -> argparse.ArgumentParser:
    """The roles alone, under the `rlfleet` command's name: a role's usage and its errors
    read as they do from the whole CLI."""
    p = argparse.ArgumentParser(prog="rlfleet", description="a role of an rlfleet cluster")
    add_role_parsers(p.add_subparsers(dest="command", required=True))
    return p


def main(argv: list[str]) -> int:
    """`rlfleet <role> ...` in this process: what a forked child of the launcher runs."""
    return run(parse_command(build_parser(), argv))
