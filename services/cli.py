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
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pydantic import Field

from rlfleet.command import (
    FLOAT,
    INT,
    NON_NEGATIVE,
    OVERRIDES_ENV,
    PORT,
    POSITIVE,
    SECONDS,
    CommandOptions,
    env,
    parse_command,
    run,
    setup_logging,
)
from rlfleet.local.options import LaunchOptions
from rlfleet.ports import free_port as free_port  # benches import it from here
from rlfleet.roles import OVERRIDES_HELP, add_role_parsers
from rlfleet.shared.contract.config import ConfigError
from rlfleet.shared.run.config import load_config
from rlfleet.slurm.submit import add_slurm_parser


def _supervision_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-restarts", type=NON_NEGATIVE, default=env("MAX_RESTARTS", "10"),
                   help="restarts of one child (a crashed collector, learner or coordinator) "
                   "before the run ends as crashed; 0: the first crash ends it "
                   "(default 10)")


def _checkpoint_option(p: argparse.ArgumentParser, help: str = (
        "act with the policy of the checkpoint at train iteration N (`rlfleet checkpoints "
        "RUN_DIR` lists them) instead of the best policy")) -> None:
    p.add_argument("--checkpoint", type=NON_NEGATIVE, default=None, metavar="N", help=help)


def _overrides_option(p: argparse.ArgumentParser, help: str = OVERRIDES_HELP) -> None:
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help=help)


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


def cmd_export(args: argparse.Namespace) -> int:
    """A run's collected episodes as a Minari dataset (`services/export.py`)."""
    from rlfleet.export import export_run

    done = export_run(args.run_dir, args.out, args.dataset_id, args.source, args.min_return,
                      args.max_return, args.limit, args.episodes, args.greedy,
                      checkpoint=args.checkpoint)
    print(f"exported {done.episodes} episodes ({done.steps} steps, mean return "
          f"{done.mean_return:.1f}) {done.origin} as {done.dataset_id} to {done.path}")
    for why in done.passed_over:  # --source auto: the sources tried before this one
        print(f"  passed over {why}")
    print(f"read it with: MINARI_DATASETS_PATH={Path(args.out).resolve()} python -c "
          f"\"import minari; print(minari.load_dataset('{done.dataset_id}'))\"")
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from rlfleet.plot import plot

    try:
        result = plot([Path(d) for d in args.run_dir], Path(args.out) if args.out else None)
    except (FileNotFoundError, ValueError) as err:
        raise ConfigError(str(err)) from None
    print(f"{result.path}: {', '.join(result.series)}")
    return 0


def cmd_battle(args: argparse.Namespace) -> int:
    from rlfleet.battle import battle_run, print_battle

    print_battle(battle_run(Path(args.run_dir), args.games, args.seed,
                            Path(args.policy) if args.policy else None))
    return 0


def cmd_play(args: argparse.Namespace) -> int:
    """A run's best policy playing its env (`services/play.py`)."""
    from rlfleet.play import play_run, print_played

    print_played(play_run(Path(args.run_dir), args.episodes, args.video, args.stochastic,
                          args.seed, checkpoint=args.checkpoint))
    return 0


def cmd_checkpoints(args: argparse.Namespace) -> int:
    """A run's kept checkpoints with their metadata (`services/checkpoints_cli.py`)."""
    from rlfleet.checkpoints_cli import main

    return main(args.run_dir, args.json)


def cmd_serve_policy(args: argparse.Namespace) -> int:
    """A run's best policy over HTTP (`services/policy_server.py`)."""
    from rlfleet.policy_server import serve_policy

    setup_logging("serve-policy")
    return serve_policy(Path(args.run_dir), args.host, args.port, args.threads, args.reload_s,
                        checkpoint=args.checkpoint)


def cmd_scale(args: argparse.Namespace) -> int:
    """Ask the run for N collectors and/or N learners: `rlfleet up` starts or drains its own,
    and so does compose's `scaler` (collectors); under Kubernetes use its scale command (the
    coordinator records the wish either way, and sizes the learner group to it)."""
    from rlfleet.shared.contract.schemas import API, RunState, ScaleRequest
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
    if getattr(args, "run_dir", None):
        from rlfleet.slurm.submit import coordinator_url

        return coordinator_url(args.run_dir)
    return args.coordinator


def cmd_check(args: argparse.Namespace) -> int:
    """Build what a config names (its env and its policy, torch and the user's code
    included): `rlfleet up` runs this in a child when a config names code by import path, so
    the launcher itself never imports torch."""
    from rlfleet.shared.run.check import check_runnable, describe_policy_class

    cfg = load_config(args.config, args.overrides)
    checked = check_runnable(cfg)
    if cfg.logging.writers:
        from rlfleet.shared.telemetry.plugins import check_writers

        check_writers(cfg.logging)
    if checked.policy_class is not None:
        print(describe_policy_class(checked.policy_class))
        print(f"capabilities of the built policy: {', '.join(checked.capabilities) or 'none'}")
    for warning in checked.warnings:
        print(f"warning: {warning}")
    print(f"{args.config}: ok")
    return 0


class SingleOptions(CommandOptions):
    """One run of `rlfleet single`, whether the command line or the Python API
    (`rlfleet.single`) started it."""

    config: str = Field(description="a YAML path or the name of a packaged config")
    overrides: tuple[str, ...] = Field((), description="`KEY=VALUE` items for the config")
    seed: int | None = None
    run_dir: str | None = Field(None, description="where to write what `rlfleet up` leaves "
                                "in a run directory; None: nowhere")


def single_options(args: argparse.Namespace) -> SingleOptions:
    """What `rlfleet single` was given."""
    return SingleOptions.checked(config=args.config, overrides=tuple(args.overrides),
                                 seed=args.seed, run_dir=args.run_dir)


def train_single(options: SingleOptions) -> int:
    """Train in this process; the exit code as `rlfleet up` ends: 0 solved, 3 stopped
    unsolved, 130 stopped by a signal."""
    from dataclasses import asdict

    from rlfleet.shared.run.check import check_runnable
    from rlfleet.single_process import run_single, train_in_dir

    setup_logging("single")
    cfg = load_config(options.config, options.overrides).with_overrides(seed=options.seed)
    if options.overrides:
        print(f"overrides: {' '.join(options.overrides)}", flush=True)
    for warning in check_runnable(cfg).warnings:
        print(f"warning: {warning}", file=sys.stderr)

    def progress(s: int, i: int, r: float, t: float) -> None:
        print(f"{t:7.1f}s env steps {s:>8,}  train it {i:>7,}  eval {r:7.1f}", flush=True)

    outcome = None
    if options.run_dir:
        res, outcome = train_in_dir(cfg, Path(options.run_dir), progress)
    else:
        res = run_single(cfg, progress=progress)
    print(asdict(res))
    return 0 if res.solved else 130 if outcome == "interrupted" else 3


def cmd_single(args: argparse.Namespace) -> int:
    return train_single(single_options(args))


def cmd_buffer(args: argparse.Namespace) -> int:
    """`rlfleet buffer save|load` (`buffer_io.py`): a file the run cannot take, or a buffer
    it does not have, is a usage error (exit 2) naming the mismatch."""
    from rlfleet.buffer_io import BufferFileError, main_load, main_save

    try:
        return main_save(args) if args.buffer_command == "save" else main_load(args)
    except BufferFileError as err:
        print(f"rlfleet buffer {args.buffer_command}: {err}", file=sys.stderr)
        return 2


def _version() -> str:
    import rlfleet

    return rlfleet.__version__


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rlfleet", description=__doc__.split("\n")[0])
    p.add_argument("--version", action="version", version=f"rlfleet {_version()}")
    sub = p.add_subparsers(dest="command", required=True)

    add_role_parsers(sub)

    u = sub.add_parser("up", help="run a whole cluster as local processes until solved")
    u.add_argument("--config", required=True)
    _overrides_option(u, OVERRIDES_HELP + "; written with the rest into the run directory's "
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
    _supervision_options(u)
    u.set_defaults(func=cmd_up)

    r = sub.add_parser("resume", help="continue a stopped or crashed run from its run "
                       "directory (buffers, counters, checkpoints and curves)")
    r.add_argument("run_dir", help="runs/<name>, as `rlfleet up` made it")
    _overrides_option(r, "config fields to change before the run goes on, as for `rlfleet "
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
    _supervision_options(r)
    r.set_defaults(func=cmd_resume)

    ex = sub.add_parser("export", help="write a run's collected episodes as a Minari dataset")
    ex.add_argument("run_dir")
    ex.add_argument("--out", required=True, help="Minari datasets root to write under")
    ex.add_argument("--dataset-id", default=None,
                    help="namespace/name-vN (default: rlfleet/<run name>-v0)")
    ex.add_argument("--source", default="auto", choices=("auto", "saved", "snapshot", "policy"),
                    help="the buffer saver's episodes (collector.save_to), a buffer snapshot, "
                    "or episodes played by the run's best policy; auto (the default): the "
                    "first of these, in this order, that holds a whole episode")
    ex.add_argument("--episodes", type=int, default=20,
                    help="--source policy (and auto when it falls back to it): episodes to "
                    "play")
    ex.add_argument("--greedy", action="store_true",
                    help="--source policy (and auto when it falls back to it): act as "
                    "evaluated (deterministic actions) instead of as when collecting (DQN: "
                    "epsilon at its final value)")
    ex.add_argument("--min-return", type=float, default=None,
                    help="keep only episodes that scored at least this")
    ex.add_argument("--max-return", type=float, default=None,
                    help="keep only episodes that scored at most this")
    ex.add_argument("--limit", type=int, default=None, help="the first N episodes kept")
    _checkpoint_option(ex, "play the episodes with the policy of the checkpoint at train "
                       "iteration N (`rlfleet checkpoints RUN_DIR` lists them) instead of the "
                       "best policy; implies --source policy")
    ex.set_defaults(func=cmd_export)

    ck = sub.add_parser("checkpoints", help="list the checkpoints a run kept (train "
                        "iteration, policy version, best, time, size, metadata)")
    ck.add_argument("run_dir", help="runs/<name>")
    ck.add_argument("--json", action="store_true", help="print JSON (for tools) instead of "
                    "a table")
    ck.set_defaults(func=cmd_checkpoints)

    pl = sub.add_parser("plot", help="draw a run's learning curves and timers to a PNG; "
                        "several runs: their returns on shared axes")
    pl.add_argument("run_dir", nargs="+", help="runs/<name> (several: compared, with --out)")
    pl.add_argument("--out", default=None, help="default: <run_dir>/curves.png")
    pl.set_defaults(func=cmd_plot)

    b = sub.add_parser("battle", help="a self-play run's trained policy against the league's "
                       "bots and its first snapshot, N games from each seat")
    b.add_argument("run_dir", help="runs/<name>")
    b.add_argument("--games", type=int, default=200, help="games per opponent and seat")
    b.add_argument("--seed", type=int, default=12345)
    b.add_argument("--policy", default=None, help="default: <run_dir>/best_policy.safetensors")
    b.set_defaults(func=cmd_battle)

    pp = sub.add_parser("play", help="a run's best policy playing the run's env: each "
                        "episode's return and length")
    pp.add_argument("run_dir", help="runs/<name>")
    pp.add_argument("--episodes", type=int, default=10)
    pp.add_argument("--video", default=None, help="write the first episode as MP4 here "
                    "(the video extra)")
    pp.add_argument("--stochastic", action="store_true", help="act as collectors do "
                    "(sampled, epsilon-greedy) instead of as evaluated (deterministic)")
    pp.add_argument("--seed", type=int, default=None, help="default: the run's seed")
    _checkpoint_option(pp)
    pp.set_defaults(func=cmd_play)

    sp = sub.add_parser("serve-policy", help="serve a run's best policy over HTTP: POST /act "
                        "(observations in, actions out, batched)")
    sp.add_argument("run_dir", help="runs/<name>")
    sp.add_argument("--host", default=env("HOST", "127.0.0.1"))
    sp.add_argument("--port", type=PORT, default=env("PORT", "8080"))
    sp.add_argument("--threads", type=POSITIVE, default=env("THREADS", "4"),
                    help="HTTP threads (inference runs one batch at a time)")
    sp.add_argument("--reload-s", type=SECONDS, default=env("RELOAD_S", "5"),
                    help="seconds between checks for a newer best policy in RUN_DIR (a run "
                    "still training), swapped in without a restart; 0: never")
    _checkpoint_option(sp, "serve the policy of the checkpoint at train iteration N "
                       "(`rlfleet checkpoints RUN_DIR` lists them) instead of the best "
                       "policy; it is never reloaded")
    sp.set_defaults(func=cmd_serve_policy)

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

    add_slurm_parser(sub, _overrides_option)

    k = sub.add_parser("check", help="check a config: load it, build its env and its policy")
    k.add_argument("--config", required=True)
    _overrides_option(k)
    k.set_defaults(func=cmd_check)

    g = sub.add_parser("single", help="train in one process (baseline, hyperparameter trials)")
    g.add_argument("--config", required=True)
    _overrides_option(g)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--run-dir", default=None, help="write what `rlfleet up` leaves in a run "
                   "directory (config.yaml, metrics.jsonl, summary.json) here")
    g.set_defaults(func=cmd_single)
    return p


def main(argv: list[str] | None = None) -> int:
    return run(parse_command(build_parser(), argv))


if __name__ == "__main__":
    sys.exit(main())
