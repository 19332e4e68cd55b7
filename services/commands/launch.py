"""`rlfleet up` and `rlfleet resume`: their parsers, and the `LaunchOptions` built from what
they parse, which the local launcher (`services/local/launcher.py`) takes. The Python API
builds the same options from keyword arguments and starts `launch` in its child
(`rlfleet.api_child`)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rlfleet.command import NON_NEGATIVE, OVERRIDES_ENV, env
from rlfleet.commands.arguments import overrides_option
from rlfleet.local.options import LaunchOptions
from rlfleet.roles import OVERRIDES_HELP


def supervision_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-restarts", type=NON_NEGATIVE, default=env("MAX_RESTARTS", "10"),
                   help="restarts of one child (a crashed collector, learner or coordinator) "
                   "before the run ends as crashed; 0: the first crash ends it "
                   "(default 10)")


def up_options(args: argparse.Namespace) -> LaunchOptions:
    """What `rlfleet up` was given, as the launcher takes it."""
    return LaunchOptions.checked(
        config=args.config, overrides=tuple(args.overrides), collectors=args.collectors,
        learners=args.learners, storage=args.storage, run_dir=args.run_dir, seed=args.seed,
        max_wall_s=args.max_wall_s, max_env_steps=args.max_env_steps, quiet=args.quiet,
        port=args.port, collector_nice=args.collector_nice, max_restarts=args.max_restarts)


def resume_options(args: argparse.Namespace) -> LaunchOptions:
    """What `rlfleet resume` was given, as the launcher takes it."""
    return LaunchOptions.checked(
        resume=True, run_dir=args.run_dir, overrides=tuple(args.overrides),
        collectors=args.collectors, learners=args.learners, max_wall_s=args.max_wall_s,
        max_env_steps=args.max_env_steps, quiet=args.quiet, port=args.port,
        collector_nice=args.collector_nice, max_restarts=args.max_restarts)


def launch(options: LaunchOptions) -> int:
    """`rlfleet up` or `rlfleet resume`, however it was started (a shell, the Python API).
    The run's overrides are in its `config.yaml`, which every child reads: a coordinator
    child must not apply `RLFLEET_OVERRIDES` (a setting of `rlfleet coordinator`) on top of
    it, so the variable goes no further than here."""
    import os

    from rlfleet.local.launcher import up

    if os.environ.pop(OVERRIDES_ENV, None):
        command = "resume" if options.resume else "up"
        print(f"rlfleet {command}: ignoring {OVERRIDES_ENV} (it is for `rlfleet "
              "coordinator`); give overrides after the options: KEY=VALUE ...",
              file=sys.stderr)
    return up(options)


def cmd_up(args: argparse.Namespace) -> int:
    return launch(up_options(args))


def cmd_resume(args: argparse.Namespace) -> int:
    """Continue a run that stopped before it was done. A run that ended solved is finished:
    training it again only risks the policy it found (its next evaluations may score far
    lower), so that takes `--continue`."""
    summary = Path(args.run_dir) / "summary.json"
    try:
        before = json.loads(summary.read_text()) if summary.is_file() else {}
    except ValueError:
        before = {}
    if before.get("outcome") == "solved" and not args.continue_run:
        print(f"rlfleet resume: {args.run_dir} is finished: it was solved (evaluation return "
              f"{before.get('eval_return')} at {before.get('env_steps')} env steps; best "
              f"policy in {before.get('best_policy')}). Nothing to do; --continue trains it "
              "further.")
        return 0
    from rlfleet.checkpoints_cli import resume_point

    if (Path(args.run_dir) / "config.yaml").is_file():  # else the launcher says what is wrong
        print(f"rlfleet resume: {args.run_dir}: {resume_point(Path(args.run_dir))}",
              flush=True)
    return launch(resume_options(args))


def add_parser(sub: argparse._SubParsersAction) -> None:
    """`rlfleet up` and `rlfleet resume`."""
    u = sub.add_parser("up", help="run a whole cluster as local processes until solved")
    u.add_argument("--config", required=True)
    overrides_option(u, OVERRIDES_HELP + "; written with the rest into the run directory's "
                     "config.yaml")
    u.add_argument("--collectors", type=int, default=2)
    u.add_argument("--learners", type=int, default=None,
                   help="learners training as one data-parallel group (default: the config's "
                   "learner.count)")
    u.add_argument("--storage", default=None, help="directory or redis://host:port/db")
    u.add_argument("--run-dir", default=None)
    u.add_argument("--seed", type=int, default=None)
    u.add_argument("--max-wall-s", type=float, default=None)
    u.add_argument("--max-env-steps", type=int, default=None)
    u.add_argument("--quiet", action="store_true", help="no live progress line")
    u.add_argument("--port", type=int, default=None, help="the coordinator's port on "
                   "127.0.0.1, where the dashboard is (default: a free one, printed at start)")
    u.add_argument("--collector-nice", type=int, default=5,
                   help="scheduling niceness of collector processes: on a small machine the "
                   "learner is the critical path, so collectors yield the CPU to it")
    supervision_options(u)
    u.set_defaults(func=cmd_up)

    r = sub.add_parser("resume", help="continue a stopped or crashed run from its run "
                       "directory (buffers, counters, checkpoints and curves)")
    r.add_argument("run_dir", help="runs/<name>, as `rlfleet up` made it")
    overrides_option(r, "config fields to change before the run goes on, as for `rlfleet "
                     "up` (KEY=VALUE after the options), written into its config.yaml; what "
                     "the stored buffers and checkpoints were made for (its env, algorithm "
                     "and networks, buffers, name and storage) stays as it was")
    r.add_argument("--collectors", type=int, default=None, help="default: as before")
    r.add_argument("--learners", type=int, default=None, help="default: as before")
    r.add_argument("--max-wall-s", type=float, default=None)
    r.add_argument("--max-env-steps", type=int, default=None)
    r.add_argument("--quiet", action="store_true", help="no live progress line")
    r.add_argument("--port", type=int, default=None, help="the coordinator's port on "
                   "127.0.0.1, where the dashboard is (default: a free one, printed at start)")
    r.add_argument("--collector-nice", type=int, default=5)
    r.add_argument("--continue", dest="continue_run", action="store_true",
                   help="train a run that already ended solved further (otherwise resume "
                   "says it is finished and exits 0)")
    supervision_options(r)
    r.set_defaults(func=cmd_resume)
