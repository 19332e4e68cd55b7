"""What talks to a running cluster's coordinator: `rlfleet scale`, `scaler` (compose's
collector containers), `status` and `buffer save|load`. A Slurm run's coordinator is found
through its run directory (`--run-dir`), wherever Slurm put it."""

from __future__ import annotations

import argparse
import sys

from rlfleet.command import FLOAT, INT, SECONDS, env, setup_logging


def cmd_scale(args: argparse.Namespace) -> int:
    """Ask the run for N collectors and/or N learners: `rlfleet up` starts or drains its own,
    and so does compose's `scaler` (collectors); under Kubernetes use its scale command (the
    coordinator records the wish either way, and sizes the learner group to it)."""
    from rlfleet.shared.contract.wire.base import API
    from rlfleet.shared.contract.wire.control import RunState, ScaleRequest
    from rlfleet.shared.infra.http import HttpClient, HttpError

    if args.collectors is None and args.learners is None:
        print("rlfleet scale: give --collectors N, --learners N or both", file=sys.stderr)
        return 2
    client = HttpClient(_coordinator(args), timeout_s=5, retries=2)
    try:
        state = client.post(f"{API}/scale", ScaleRequest(collectors=args.collectors,
                                                         learners=args.learners), RunState)
    except HttpError as err:
        print(f"rlfleet scale: {err}", file=sys.stderr)
        return 1
    finally:
        client.close()
    print(f"collectors wanted: {state.collectors_desired} (alive now: "
          f"{state.collectors_alive}); learners wanted: {state.learners_desired} (alive now: "
          f"{state.learners_alive}); run {state.state}")
    return 0


def cmd_scaler(args: argparse.Namespace) -> int:
    """Add and remove collector containers to follow the run's wish (services/scaler.py)."""
    from rlfleet.scaler import ScalerError, main

    setup_logging("scaler")
    if args.min_env_steps_per_s and not args.max_collectors:
        print("rlfleet scaler: --min-env-steps-per-s needs --max-collectors", file=sys.stderr)
        return 2
    try:
        return main(args)
    except ScalerError as err:
        print(f"rlfleet scaler: {err}", file=sys.stderr)
        return 2


def cmd_status(args: argparse.Namespace) -> int:
    from rlfleet.status import print_status

    return print_status(_coordinator(args))


def _coordinator(args: argparse.Namespace) -> str:
    """`--coordinator URL`, or the address a Slurm run's coordinator wrote into its run
    directory (`--run-dir`)."""
    if args.run_dir:
        from rlfleet.slurm.submit import coordinator_url

        return coordinator_url(args.run_dir)
    return args.coordinator


def cmd_buffer(args: argparse.Namespace) -> int:
    """`rlfleet buffer save|load` (`buffer_io.py`): a file the run cannot take, or a buffer
    it does not have, is a usage error (exit 2) naming the mismatch."""
    from rlfleet.buffer_io import BufferFileError, main_load, main_save

    try:
        return main_save(args) if args.buffer_command == "save" else main_load(args)
    except BufferFileError as err:
        print(f"rlfleet buffer {args.buffer_command}: {err}", file=sys.stderr)
        return 2


def add_parser(sub: argparse._SubParsersAction) -> None:
    """`rlfleet scale`, `scaler`, `status` and `buffer save|load`."""
    sc = sub.add_parser("scale", help="change the number of collectors or learners of a "
                        "running run")
    sc.add_argument("--collectors", type=int, default=None)
    sc.add_argument("--learners", type=int, default=None, help="learners in the learner "
                    "group (the config must split its batch among them)")
    sc.add_argument("--coordinator", default=env("COORDINATOR", "http://127.0.0.1:8000"))
    sc.add_argument("--run-dir", default=None, help="a Slurm run's directory: its "
                    "coordinator, wherever it runs (instead of --coordinator)")
    sc.set_defaults(func=cmd_scale)

    sl = sub.add_parser("scaler", help="under compose: add and remove collector containers "
                        "as `rlfleet scale` asks (needs the Docker socket)")
    sl.add_argument("--coordinator", default=env("COORDINATOR", "http://127.0.0.1:8000"))
    sl.add_argument("--project", default=env("COMPOSE_PROJECT"),
                    help="compose project (default: the one of the container it runs in)")
    sl.add_argument("--service", default=env("SCALE_SERVICE", "collector"))
    sl.add_argument("--grace-s", type=SECONDS, default=env("GRACE_S", "30"),
                    help="SIGTERM to SIGKILL when a container is removed (it drains meanwhile)")
    sl.add_argument("--interval-s", type=SECONDS, default=env("INTERVAL_S", "2"))
    sl.add_argument("--min-env-steps-per-s", type=FLOAT,
                    default=env("MIN_ENV_STEPS_PER_S", "0"),
                    help="autoscale: add a collector while the run is slower than this")
    sl.add_argument("--max-collectors", type=INT, default=env("MAX_COLLECTORS", "0"))
    sl.add_argument("--rule-window-s", type=SECONDS, default=env("RULE_WINDOW_S", "30"))
    sl.set_defaults(func=cmd_scaler)

    s = sub.add_parser("status", help="print a running cluster as a table")
    s.add_argument("--coordinator", default=env("COORDINATOR", "http://127.0.0.1:8000"))
    s.add_argument("--run-dir", default=None, help="a Slurm run's directory: its "
                   "coordinator, wherever it runs (instead of --coordinator)")
    s.set_defaults(func=cmd_status)

    bf = sub.add_parser("buffer", help="save a run's replay buffer to a file, or load one "
                        "into a running run's buffer")
    bfs = bf.add_subparsers(dest="buffer_command", required=True)
    bsave = bfs.add_parser("save", help="write a buffer's transitions to one safetensors "
                           "file: of a live run with --coordinator, else of the stopped "
                           "run's last snapshot")
    bsave.add_argument("run_dir", metavar="RUN_DIR", help="the run's directory (its "
                       "config.yaml names its env and storage)")
    bsave.add_argument("--buffer", required=True, help="the buffer's name in the config")
    bsave.add_argument("--out", required=True, metavar="FILE")
    bsave.add_argument("--coordinator", default=None, help="the live run's coordinator URL")
    bsave.set_defaults(func=cmd_buffer)
    bload = bfs.add_parser("load", help="insert a saved file's transitions into a running "
                           "run's buffer (its env and spaces must match)")
    bload.add_argument("run_dir", metavar="RUN_DIR", help="the running run's directory")
    bload.add_argument("--buffer", required=True, help="the buffer's name in the config")
    bload.add_argument("--in", dest="input", required=True, metavar="FILE")
    bload.add_argument("--coordinator", default=env("COORDINATOR", "http://127.0.0.1:8000"))
    bload.set_defaults(func=cmd_buffer)
