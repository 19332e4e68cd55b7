"""What a job of a Slurm run runs: `rlfleet slurm job <role> --run-dir RUN_DIR`.

- **coordinator**: serves the coordinator from this process on the node Slurm chose (a free
  port on all its addresses), writes where it is (`rendezvous.py`), and keeps the learner and
  collector jobs (`keeper.py`) until the run is over; then it waits for the workers to leave,
  writes `summary.json` and `evaluations.json` and ends. With `--redis` it first starts a
  Redis on its node, persisted in the run directory, for the run's storage. Run again after
  a requeue, it continues from the last snapshot in storage (`--resume`), and where it now
  answers at another address it requeues the worker jobs, so that they find it again.
- **learner**, **collector**: read the coordinator's address from the run directory and serve
  the role, under the id `<role>-<job id>` (a requeued job registers again as itself). The
  process ends when the run is over, or when the coordinator's job has left the queue.

Signals: SIGTERM (`scancel`, `scontrol requeue`, a preemption; Slurm's `KillWait` is the
grace) stops the role as on any machine: a collector drains, a learner saves a checkpoint,
the coordinator writes its snapshot. SIGUSR1, the warning `--signal=B:USR1@N` gives before a
time limit, does the same and then requeues the job, so the run goes on in a new allocation.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from rlfleet import run_summary
from rlfleet.ports import free_port
from rlfleet.serve import InProcessServer
from rlfleet.shared.contract.wire.base import API
from rlfleet.shared.infra.http import HttpClient, HttpError
from rlfleet.slurm import commands, rendezvous
from rlfleet.slurm.commands import SlurmError
from rlfleet.slurm.keeper import INTERVAL_S, Keeper
from rlfleet.slurm.plan import SlurmPlan, load_plan
from rlfleet.slurm.rendezvous import Rendezvous
from rlfleet.slurm.scripts import REDIS_PASSWORD_FILE

log = logging.getLogger("rlfleet.slurm")

# After the run is over: how long the coordinator waits for the worker jobs to leave on
# their own (they stop at their next heartbeat) before it cancels what is left.
WORKERS_LEAVE_S = 60.0
RENDEZVOUS_WAIT_S = 900.0  # a worker job waits this long for the coordinator's address
ORPHAN_CHECK_S = 30.0  # how often a worker asks whether the coordinator's job still exists
REDIS_START_S = 60.0


def job_id() -> str:
    return os.environ.get("SLURM_JOB_ID", "")


def restart_count() -> int:
    try:
        return int(os.environ.get("SLURM_RESTART_COUNT") or 0)
    except ValueError:
        return 0


def node_name() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def own_address(towards: str | None = None) -> str:
    """An address of this node the others reach it at: the one this node sends from towards
    `towards` (a connected UDP socket sends nothing), else Slurm's `NodeAddr` for it, else
    its hostname."""
    if towards:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((towards, 9))
                return s.getsockname()[0]
        except OSError:
            pass
    return commands.node_address(node_name()) or socket.gethostname()


class Warned:
    """SIGUSR1 (Slurm's warning before a time limit): stop like SIGTERM, then requeue."""

    def __init__(self) -> None:
        self.warned = threading.Event()

    def install(self, stop: Callable[[], None]) -> None:
        def on_usr1(signum, frame) -> None:
            log.warning("Slurm's warning (SIGUSR1): stopping, then requeueing job %s",
                        job_id())
            self.warned.set()
            stop()

        signal.signal(signal.SIGUSR1, on_usr1)

    def requeue_if_warned(self, run_over: bool) -> None:
        if self.warned.is_set() and not run_over and job_id():
            try:
                commands.requeue(job_id())
            except SlurmError as err:
                log.error("could not requeue job %s: %s", job_id(), err)


# -- the coordinator's job ---------------------------------------------------------------------

def start_redis(plan: SlurmPlan, address: str) -> tuple[subprocess.Popen, str]:
    """A Redis for the run's storage on this node: append-only files in the run directory
    (a requeued job finds its data again), a password in a file only the owner reads."""
    from rlfleet.local.children import die_with_parent

    data = plan.slurm_dir() / "redis"
    data.mkdir(parents=True, exist_ok=True)
    password_file = plan.slurm_dir() / REDIS_PASSWORD_FILE  # written by `submit`
    password = password_file.read_text().strip()
    port = free_port("0.0.0.0")
    proc = subprocess.Popen(
        ["redis-server", "-", "--bind", "0.0.0.0", "--port", str(port), "--dir", str(data),
         "--appendonly", "yes", "--save", "", "--protected-mode", "no"],
        stdin=subprocess.PIPE, preexec_fn=die_with_parent)
    assert proc.stdin is not None
    proc.stdin.write(f"requirepass {password}\n".encode())  # not on the command line
    proc.stdin.close()
    deadline = time.monotonic() + REDIS_START_S
    while True:  # listening (and its append-only file loaded) before the coordinator opens it
        try:
            with socket.create_connection((address, port), timeout=1):
                break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start on {address}:{port} (exit "
                                   f"{proc.poll()})") from None
            time.sleep(0.1)
    os.environ["RLFLEET_STORAGE_PASSWORD_FILE"] = str(password_file)
    return proc, f"redis://{address}:{port}/0"


def coordinator_job(run_dir: Path) -> int:
    from rlfleet.roles import coordinator_factory

    plan = load_plan(run_dir)
    before = rendezvous.read(run_dir)
    restarts = restart_count()
    address = own_address()
    redis = None
    storage = plan.storage
    if plan.redis:
        redis, storage = start_redis(plan, address)
    port = free_port("0.0.0.0")
    args = argparse.Namespace(config=plan.config, overrides=[], seed=None, name=None,
                              worker_networks=None, run_dir=str(run_dir), storage=storage,
                              resume=restarts > 0 or before is not None)
    server = InProcessServer(coordinator_factory(args)(), "0.0.0.0", port, threads=16)
    server.listen()
    url = f"http://{address}:{port}"
    warned = Warned()
    warned.install(server.request_stop)
    rv = Rendezvous(url=url, job_id=job_id(), node=node_name(), restart_count=restarts,
                    storage=storage, started_at=time.time())
    keeper = Keeper(plan, url)
    over = threading.Event()
    thread = threading.Thread(target=keep, args=(plan, keeper, server, over, rv, before),
                              name="keeper", daemon=True)
    log.info("coordinator of run %s at %s (job %s on %s, restart %d)", Path(run_dir).name,
             url, rv.job_id, rv.node, restarts)
    thread.start()
    try:
        code = server.run()
    finally:
        keeper.close()
        if redis is not None:
            redis.terminate()
            redis.wait(30)
    warned.requeue_if_warned(over.is_set())
    return code


def keep(plan: SlurmPlan, keeper: Keeper, server: InProcessServer, over: threading.Event,
         rv: Rendezvous, before: Rendezvous | None) -> None:
    """The keeper's thread: announce the coordinator, keep the jobs, end the run."""
    try:
        rendezvous.write(plan.run_dir, rv)
        if before is not None and before.url != rv.url:
            moved(keeper, before.url, rv.url)
        state = None
        while not server.wait_stop(0):
            state = keeper.tick()
            if state is not None and state.state == "stopped":
                break
            server.wait_stop(INTERVAL_S)
        if state is None or state.state != "stopped":
            return  # this job was told to stop: the run goes on after its requeue
        over.set()
        log.info("the run is over (%s): waiting for the workers to leave", state.stop_reason)
        finish(plan, keeper, rv)
    except Exception:
        log.exception("keeper failed")
    finally:
        server.request_stop()


def moved(keeper: Keeper, old: str, new: str) -> None:
    """The coordinator answers elsewhere than before its requeue: the worker jobs still
    running talk to the old address; requeued, they read the new one."""
    for job in keeper.worker_jobs():
        if job.state == "RUNNING":
            log.info("the coordinator moved from %s to %s: requeueing %s job %s", old, new,
                     job.name, job.job_id)
            try:
                commands.requeue(job.job_id)
            except SlurmError as err:
                log.warning("%s", err)


def finish(plan: SlurmPlan, keeper: Keeper, rv: Rendezvous) -> None:
    deadline = time.monotonic() + WORKERS_LEAVE_S
    while time.monotonic() < deadline and keeper.worker_jobs():
        time.sleep(1.0)
    left = [j.job_id for j in keeper.worker_jobs()]
    if left:
        log.warning("cancelling worker jobs that did not leave: %s", ", ".join(left))
        try:
            commands.cancel(left)
        except SlurmError as err:
            log.warning("%s", err)
    write_summary(plan, keeper.client, rv)
    rendezvous.write(plan.run_dir, rv.model_copy(update={"ended": True}))


# summary.json's keys for a Slurm run: those of `rlfleet up` it has, and its own figures
# counted from the submission.
SUMMARY_KEYS = (
    "solved", "outcome", "stop_reason", "eval_return", "best_eval_return",
    "best_policy_version", "stop_value", "env_steps", "train_iterations", "policy_version",
    "chunks_accepted", "episodes", "run_seconds", "first_chunk_seconds",
    "first_chunk_s_from_submit", "solve_s_from_submit", "wall_seconds_from_submit",
    "collectors", "learners", "storage", "slurm", "train",
)


def write_summary(plan: SlurmPlan, client: HttpClient, rv: Rendezvous) -> None:
    """`summary.json` and `evaluations.json`, with the keys `rlfleet up` writes that a Slurm
    run has, and when its first chunk came counted from the submission."""
    run_dir = Path(plan.run_dir)
    try:
        s = client.get(f"{API}/status")
        evaluations = run_summary.evaluation_history(client)
    except HttpError as err:
        log.error("summary not written: %s", err)
        return
    run_summary.write_evaluations(run_dir, evaluations)
    run = s.get("run", {})
    first = run.get("first_chunk_s")
    run_summary.write_summary(run_dir, run_summary.build_summary(SUMMARY_KEYS, s, {
        # seconds from `rlfleet slurm submit` to the first chunk, through the queue
        "first_chunk_s_from_submit": (round(rv.started_at - plan.submitted_at + first, 3)
                                      if first is not None and plan.submitted_at else None),
        # seconds from `rlfleet slurm submit` to the evaluation that solved the run
        "solve_s_from_submit": (round(rv.started_at - plan.submitted_at
                                      + run["wall_seconds"], 3)
                                if run.get("solved") and plan.submitted_at else None),
        "wall_seconds_from_submit": round(time.time() - plan.submitted_at, 3),
        "collectors": plan.collectors,
        "learners": plan.learners,
        "storage": rv.storage,
        "slurm": {"tag": plan.tag, "coordinator_job": rv.job_id, "node": rv.node,
                  "restart_count": rv.restart_count},
    }))


# -- a learner's or a collector's job ----------------------------------------------------------

def coordinator_gone(plan: SlurmPlan) -> str | None:
    """Why a worker should stop waiting for the coordinator: its job left the queue."""
    try:
        live = [j for j in commands.jobs([plan.name("coordinator")]) if j.live]
    except SlurmError as err:
        log.warning("%s", err)
        return None
    return None if live else f"the coordinator's job ({plan.name('coordinator')}) is gone"


def worker_job(role: str, run_dir: Path) -> int:
    from rlfleet.shared.worker import WorkerService, create_worker_app

    plan = load_plan(run_dir)
    rv = rendezvous.wait(run_dir, RENDEZVOUS_WAIT_S, lambda: coordinator_gone(plan))
    coordinator_host = urlsplit(rv.url).hostname
    address = own_address(coordinator_host)
    port = free_port("0.0.0.0")
    service_class: type[WorkerService]
    if role == "collector":
        from rlfleet.collector.service import CollectorService

        service_class = CollectorService
    else:
        from rlfleet.shared.infra.priority import import_nicer

        service_class = import_nicer("rlfleet.learner.service", "LearnerService")
    worker_id = f"{role}-{job_id()}" if job_id() else None
    service = service_class(rv.url, f"http://{address}:{port}", worker_id, None)
    server = InProcessServer(create_worker_app(service), "0.0.0.0", port, threads=4)
    over = threading.Event()
    stopped_hook = service.on_run_stopped

    def on_run_stopped() -> None:  # the run is over: this job ends too
        over.set()
        stopped_hook()
        server.request_stop()

    service.agent.on_stop = on_run_stopped  # the hook's one caller: the service's agent
    warned = Warned()
    warned.install(server.request_stop)
    watchdog = threading.Thread(target=watch_coordinator, args=(plan, server), daemon=True,
                                name="coordinator-watch")
    watchdog.start()
    log.info("%s of run %s: coordinator %s, serving at http://%s:%d (job %s on %s)", role,
             Path(run_dir).name, rv.url, address, port, job_id(), node_name())
    code = server.run()
    warned.requeue_if_warned(over.is_set())
    return code


def watch_coordinator(plan: SlurmPlan, server: InProcessServer) -> None:
    """End this worker when the coordinator's job has left the queue for good (twice in a
    row, `ORPHAN_CHECK_S` apart): nobody would ever tell it the run is over."""
    misses = 0
    while not server.wait_stop(ORPHAN_CHECK_S):
        why = coordinator_gone(plan)
        misses = misses + 1 if why else 0
        if misses >= 2:
            log.warning("%s: stopping", why)
            server.request_stop()
            return
