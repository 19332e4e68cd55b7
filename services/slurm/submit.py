"""`rlfleet slurm submit CONFIG`, `rlfleet slurm cancel RUN_DIR` and the `rlfleet slurm job`
entry point the job scripts run.

`submit` resolves and checks the config as `rlfleet up` does (a bad field exits 2 naming it),
writes the run directory (on a path every node mounts: the config, the plan, the job scripts),
and submits the coordinator's job, whose keeper submits the learner and collector jobs
(`keeper.py`). With `--wait` it stays, prints the run's progress and exits as `rlfleet up`
does: 0 solved, 3 stopped unsolved, 1 when the run ended without a summary.
"""

from __future__ import annotations

import argparse
import json
import secrets
import shlex
import sys
import time
from pathlib import Path

from pydantic import ValidationError

from rlfleet.command import POSITIVE
from rlfleet.shared.contract.config import ConfigError
from rlfleet.slurm import commands, rendezvous
from rlfleet.slurm.commands import SlurmError
from rlfleet.slurm.plan import SlurmPlan, check_time, load_plan, write_plan
from rlfleet.slurm.scripts import REDIS_PASSWORD_FILE, write_scripts

POLL_S = 3.0


def build_plan(args: argparse.Namespace) -> SlurmPlan:
    """The run directory and its config, as `rlfleet up` writes them, and the Slurm plan."""
    from rlfleet.local.options import LaunchOptions
    from rlfleet.local.plan import make_plan
    from rlfleet.shared.contract.config import cuda_devices_needed

    if args.collectors < 0:
        raise ConfigError(f"--collectors={args.collectors}: give 0 or more")
    # The nodes' devices are the run's, not this machine's; Slurm restarts the jobs.
    local = make_plan(LaunchOptions.checked(
        config=args.config, overrides=tuple(args.overrides), run_dir=args.run_dir,
        storage=args.storage, learners=args.learners, seed=args.seed,
        max_wall_s=args.max_wall_s, max_env_steps=args.max_env_steps,
        collectors=args.collectors, collector_nice=0, max_restarts=0, local_devices=False))
    cfg = local.config
    if cuda_devices_needed(cfg.learner.device) and not args.learner_gpus:
        raise ConfigError(f"learner.device={cfg.learner.device!r} asks for a GPU but "
                          "--learner-gpus is 0: give --learner-gpus N (GPUs per learner job) "
                          "or learner.device=auto")
    if cuda_devices_needed(cfg.collector.device):
        raise ConfigError(f"collector.device={cfg.collector.device!r}: collector jobs get no "
                          "GPU on Slurm; use collector.device=cpu")
    check_time(args.time, "--time")
    check_time(args.coordinator_time, "--coordinator-time")
    tag = f"rlfleet-{cfg.name[:40]}-{secrets.token_hex(3)}"
    python = shlex.split(args.python) if args.python else [sys.executable]
    if args.redis and str(local.storage).startswith("redis://"):
        raise ConfigError("--redis starts a Redis for the run, but its storage is already "
                          f"{local.storage}: give one or the other")
    try:
        plan = SlurmPlan(tag=tag, run_dir=str(local.run_dir), config=str(local.config_path),
                         storage=local.storage, collectors=args.collectors,
                         learners=local.learners, python=python, partition=args.partition,
                         learner_partition=args.learner_partition,
                         collector_partition=args.collector_partition,
                         learner_gpus=args.learner_gpus, learner_cpus=args.learner_cpus,
                         collector_cpus=args.collector_cpus,
                         coordinator_cpus=args.coordinator_cpus, mem=args.mem, time=args.time,
                         coordinator_time=args.coordinator_time, signal_s=args.signal_s,
                         account=args.account, sbatch_args=args.sbatch_arg or [],
                         redis=args.redis, submitted_at=time.time())
    except ValidationError as err:  # a field is the option of the same name
        first = err.errors()[0]
        option = "--" + str(first["loc"][0]).replace("_", "-")
        raise ConfigError(f"{option}={first.get('input')!r}: {first['msg']}") from None
    write_plan(plan)
    write_scripts(plan)
    if plan.redis:  # every job's environment names it: it exists before any job starts
        password = plan.slurm_dir() / REDIS_PASSWORD_FILE
        password.touch(mode=0o600)
        password.chmod(0o600)
        password.write_text(secrets.token_urlsafe(24))
    return plan


def cmd_submit(args: argparse.Namespace) -> int:
    plan = build_plan(args)
    scripts = plan.slurm_dir()
    print(f"rlfleet slurm submit: run dir {plan.run_dir} (job scripts in {scripts})")
    if args.dry_run:
        print((scripts / "coordinator.sbatch").read_text())
        return 0
    why = commands.available()
    if why:
        raise ConfigError(f"{why}: run this where Slurm's commands are (a login node)")
    try:
        job = commands.sbatch(str(scripts / "coordinator.sbatch"))
    except SlurmError as err:
        print(f"rlfleet slurm submit: {err}", file=sys.stderr)
        return 1
    (scripts / "submitted.json").write_text(json.dumps({"coordinator_job": job,
                                                         "submitted_at": plan.submitted_at}))
    print(f"submitted the coordinator's job {job} ({plan.name('coordinator')}); it starts "
          f"{plan.learners} learner and {plan.collectors} collector jobs.\n"
          f"  status: rlfleet status --run-dir {plan.run_dir}\n"
          f"  scale:  rlfleet scale --run-dir {plan.run_dir} --collectors N\n"
          f"  cancel: rlfleet slurm cancel {plan.run_dir}")
    if not args.wait:
        return 0
    return follow(plan, job, quiet=args.quiet)


def follow(plan: SlurmPlan, job: str, quiet: bool = False) -> int:
    """Until the coordinator's job has left the queue: a line of progress now and then; then
    the summary's closing line and `rlfleet up`'s exit code."""
    from rlfleet.shared.contract.wire.base import API
    from rlfleet.shared.infra.http import HttpClient, HttpError

    said = 0.0
    while True:
        try:
            queued = any(j.live for j in commands.jobs([plan.name("coordinator")]))
        except SlurmError as err:
            print(f"rlfleet slurm: {err}", file=sys.stderr)
            queued = True  # not known: asked again after the next poll
        if not queued:
            break
        rv = rendezvous.read(plan.run_dir)
        if not quiet and rv is not None and time.monotonic() - said > 10:
            said = time.monotonic()
            client = HttpClient(rv.url, timeout_s=3, retries=0)
            try:
                s = client.get(f"{API}/status")
                ev = s.get("latest_evaluation") or {}
                alive: dict[str, int] = {}
                for w in s.get("workers", []):
                    alive[w["role"]] = alive.get(w["role"], 0) + (w["state"] == "alive")
                print(f"{time.strftime('%H:%M:%S')} env steps "
                      f"{s['counters']['env_steps']:,}, last eval "
                      f"{ev.get('return_mean', '-')}, learners {alive.get('learner', 0)}, "
                      f"collectors {alive.get('collector', 0)} ({s['run']['state']})",
                      file=sys.stderr)
            except (HttpError, KeyError):
                pass
            finally:
                client.close()
        time.sleep(POLL_S)
    path = Path(plan.run_dir) / "summary.json"
    if not path.exists():
        print(f"rlfleet slurm: the coordinator's job {job} ended without a summary: see "
              f"{plan.slurm_dir() / 'logs'}", file=sys.stderr)
        return 1
    summary = json.loads(path.read_text())
    print(f"summary: {path}: solved={summary['solved']} eval_return="
          f"{summary['eval_return']} env_steps={summary['env_steps']} "
          f"wall_seconds_from_submit={summary['wall_seconds_from_submit']}")
    return 0 if summary["solved"] else 3


def cmd_cancel(args: argparse.Namespace) -> int:
    """Every job of the run: the workers first, so that they leave while the coordinator
    still answers."""
    plan = load_plan(args.run_dir)
    try:
        workers = [j.job_id for j in commands.jobs([plan.name("learner"),
                                                    plan.name("collector")]) if j.live]
        commands.cancel(workers)
        coordinator = [j.job_id for j in commands.jobs([plan.name("coordinator")]) if j.live]
        if workers and coordinator:
            time.sleep(5)  # the workers' SIGTERM: they drain and leave meanwhile
        commands.cancel(coordinator)
    except SlurmError as err:
        print(f"rlfleet slurm cancel: {err}", file=sys.stderr)
        return 1
    print(f"cancelled {len(workers) + len(coordinator)} jobs of {plan.tag}")
    return 0


def cmd_job(args: argparse.Namespace) -> int:
    from rlfleet.command import setup_logging
    from rlfleet.slurm.jobs import coordinator_job, worker_job

    setup_logging(f"slurm-{args.role}")
    run_dir = Path(args.run_dir)
    if args.role == "coordinator":
        return coordinator_job(run_dir)
    return worker_job(args.role, run_dir)


def coordinator_url(run_dir: str) -> str:
    """The coordinator's URL from a Slurm run's directory (`rlfleet status/scale --run-dir`)."""
    rv = rendezvous.read(run_dir)
    if rv is None:
        raise ConfigError(f"--run-dir {run_dir}: no coordinator address in "
                          f"{rendezvous.path(run_dir)} (not a Slurm run, or its coordinator "
                          "has not started yet)")
    return rv.url


def add_parser(sub: argparse._SubParsersAction) -> None:
    """`rlfleet slurm submit|cancel|job`."""
    from rlfleet.commands.arguments import overrides_option

    s = sub.add_parser("slurm", help="run on a Slurm cluster: submit a run, cancel it")
    ss = s.add_subparsers(dest="slurm_command", required=True)

    p = ss.add_parser("submit", help="submit a run: the coordinator's job, which starts the "
                      "learner and collector jobs and keeps them")
    p.add_argument("--config", required=True)
    overrides_option(p, "config fields to change, as for `rlfleet up`")
    p.add_argument("--collectors", type=int, default=2, help="collector jobs (one each)")
    p.add_argument("--learners", type=int, default=None,
                   help="learner jobs, one data-parallel group (default: learner.count)")
    p.add_argument("--learner-gpus", type=int, default=0, help="GPUs per learner job "
                   "(--gres=gpu:N)")
    p.add_argument("--partition", default=None, help="every job's partition")
    p.add_argument("--learner-partition", default=None)
    p.add_argument("--collector-partition", default=None)
    p.add_argument("--learner-cpus", type=POSITIVE, default=2)
    p.add_argument("--collector-cpus", type=POSITIVE, default=1)
    p.add_argument("--coordinator-cpus", type=POSITIVE, default=1)
    p.add_argument("--mem", default=None, help="memory per job (sbatch --mem)")
    p.add_argument("--time", default=None, help="the worker jobs' time limit")
    p.add_argument("--coordinator-time", default=None)
    p.add_argument("--signal-s", type=int, default=None, help="seconds of warning before a "
                   "time limit (--signal=B:USR1@N): the job stops cleanly and requeues itself")
    p.add_argument("--account", default=None)
    p.add_argument("--sbatch-arg", action="append", default=None, metavar="ARG",
                   help="one more sbatch option for every job (repeatable): "
                   "--sbatch-arg=--qos=long")
    p.add_argument("--python", default=None, help="the command that runs Python with "
                   "rlfleet on the nodes (default: this one); e.g. 'apptainer exec "
                   "rlfleet.sif python'")
    p.add_argument("--run-dir", default=None, help="on a path every node mounts (default: "
                   "runs/<name>-<time> here)")
    p.add_argument("--storage", default=None, help="directory every node mounts, or "
                   "redis://host:port/db (default: <run-dir>/storage)")
    p.add_argument("--redis", action="store_true", help="start a Redis in the coordinator's "
                   "job for the run's storage (persisted in the run directory)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--max-wall-s", type=float, default=None)
    p.add_argument("--max-env-steps", type=int, default=None)
    p.add_argument("--wait", action="store_true", help="stay until the run is over; exit "
                   "0 solved, 3 stopped")
    p.add_argument("--quiet", action="store_true", help="with --wait: no progress lines")
    p.add_argument("--dry-run", action="store_true", help="write the run directory and the "
                   "job scripts, submit nothing")
    p.set_defaults(func=cmd_submit)

    c = ss.add_parser("cancel", help="cancel every job of a run")
    c.add_argument("run_dir")
    c.set_defaults(func=cmd_cancel)

    j = ss.add_parser("job", help="what a job script runs (not for people)")
    j.add_argument("role", choices=("coordinator", "learner", "collector"))
    j.add_argument("--run-dir", required=True)
    j.set_defaults(func=cmd_job)
