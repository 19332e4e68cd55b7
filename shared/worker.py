"""What every worker service (collector, learner) has in common.

- `WorkerAgent` keeps the worker known to the coordinator: it registers (retrying while the
  coordinator is not up yet) with what the worker has (`shared/infra/resources.py`),
  heartbeats, registers again when a heartbeat gets 404 (the coordinator restarted or
  declared it dead), and leaves on shutdown. A registration the coordinator refuses (a 4xx:
  a config asking for a GPU this worker lacks, a URL outside its networks, a wrong token,
  a worker id a live process at another URL holds) is not tried again: the worker fails
  with the coordinator's reason. So does a worker whose heartbeat gets 409: another process
  took its id while it was silent (frozen past the heartbeat timeout), and two processes
  under one id would take turns at its tasks.
- `WorkerService` is the base of a role: it owns the agent, accepts tasks and reports status.
- `Turns` is how roles that share one process (the single-process runner) take turns at
  their heavy work, so a collector's env steps never interleave with a learner's update.
- `create_worker_app` is the Flask app factory around a service: `/health`, `/status` and
  `POST /task`, the same under cheroot (`services/serve.py`) and the pytest client; with a
  cluster token set, all but `/health` need it (`rlfleet.shared.infra.auth`).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flask import Flask, current_app, jsonify

from rlfleet.shared.contract.wire.base import API, Role
from rlfleet.shared.contract.wire.membership import (
    HeartbeatRequest,
    HeartbeatResponse,
    RegisterRequest,
    RegisterResponse,
)
from rlfleet.shared.contract.wire.tasks import TaskAccepted, TaskEnvelope, TaskResult
from rlfleet.shared.infra.auth import install_token_guard, load_token
from rlfleet.shared.infra.crash import describe, write_crash
from rlfleet.shared.infra.http import HttpClient, HttpError
from rlfleet.shared.infra.resources import CudaApi, probe_resources
from rlfleet.shared.infra.webapp import install_error_handlers, parse_body
from rlfleet.shared.run.config import RunConfig, parse_config

log = logging.getLogger("rlfleet.worker")

FIRST_REGISTER_INTERVAL_S = 0.1
QUIET_S = 5.0
# 4xx answers to a registration that may pass when tried again; any other 4xx is a refusal.
TRANSIENT_4XX = frozenset({408, 429})


class RegistrationRefused(RuntimeError):
    """The coordinator refused this worker's registration, or its heartbeat (`HttpError`
    carries its answer): the worker cannot go on under its id."""

    def __init__(self, role: Role, err: HttpError) -> None:
        reason = err.body.get("error") if isinstance(err.body.get("error"), str) else str(err)
        super().__init__(f"the coordinator refused this {role.value} ({err.status}): {reason}")
        self.status = err.status
        self.field = err.body.get("field")


def refused(err: HttpError) -> bool:
    """A registration's failure that trying again cannot mend."""
    return err.status is not None and 400 <= err.status < 500 \
        and err.status not in TRANSIENT_4XX


def torch_cuda() -> CudaApi | None:
    """`torch.cuda`, for the resource probe; None without torch. Imported only where the
    probe finds a GPU driver: a collector on a CPU machine loads torch later, off the path
    to its first chunk (`collector/torch_loader.py`)."""
    try:
        import torch
    except ImportError:
        return None
    return torch.cuda


class WorkerAgent:
    def __init__(self, coordinator_url: str, role: Role, advertise_url: str,
                 worker_id: str | None = None,
                 on_registered: Callable[[RegisterResponse], None] | None = None,
                 on_stop: Callable[[], None] | None = None,
                 status: Callable[[], dict[str, float]] | None = None,
                 on_heartbeat: Callable[[HeartbeatResponse], None] | None = None,
                 on_refused: Callable[[RegistrationRefused], None] | None = None) -> None:
        self.role = role
        self.advertise_url = advertise_url
        self.requested_id = worker_id
        self.client = HttpClient(coordinator_url, timeout_s=10, retries=3)
        self.on_registered = on_registered
        self.on_stop = on_stop
        self.on_heartbeat = on_heartbeat
        self.on_refused = on_refused
        self.status = status or dict
        # Probed once, here: sent with every registration. A bad RLFLEET_FAKE_GPUS is a
        # ConfigError now, at start, not a registration that fails over and over.
        self.resources = probe_resources(torch_cuda)
        self.info: RegisterResponse | None = None
        self.refusal: RegistrationRefused | None = None
        self.registered = threading.Event()
        self._answered = threading.Event()  # registered, or refused
        self.stop_requested = threading.Event()
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"{role.value}-agent",
                                        daemon=True)

    @property
    def worker_id(self) -> str | None:
        return self.info.worker_id if self.info else None

    def start(self) -> WorkerAgent:
        self._thread.start()
        return self

    def wait_registered(self, timeout: float | None = None) -> RegisterResponse:
        """The registration's answer; raises `RegistrationRefused` if it was refused."""
        if not self._answered.wait(timeout):
            raise TimeoutError(f"{self.role.value} did not register within {timeout}s")
        if self.refusal is not None:
            raise self.refusal
        assert self.info is not None
        return self.info

    def _register(self, retries: int | None = None) -> None:
        """Raises `RegistrationRefused` for an answer that trying again cannot change, and
        `HttpError` for a coordinator that could not be reached."""
        req = RegisterRequest(role=self.role, url=self.advertise_url,
                              worker_id=self.worker_id or self.requested_id,
                              resources=self.resources)
        try:
            info = self.client.post(f"{API}/workers", req, RegisterResponse, retries=retries)
        except HttpError as err:
            if refused(err):
                raise RegistrationRefused(self.role, err) from err
            raise
        first = self.info is None
        self.info = info
        self.registered.set()
        self._answered.set()
        log.info("%s as %s with %s", "registered" if first else "registered again",
                 info.worker_id, self.client.base_url)
        if self.on_registered:
            self.on_registered(info)

    def _heartbeat(self) -> None:
        try:
            hb = self.client.post(f"{API}/workers/{self.worker_id}/heartbeat",
                                  HeartbeatRequest(status=self.status(),
                                                   url=self.advertise_url), HeartbeatResponse)
        except HttpError as err:
            if err.status == 404:
                log.warning("coordinator does not know %s any more: registering again",
                            self.worker_id)
                self._register()
                return
            if err.status == 409:  # superseded: another process holds this id now
                raise RegistrationRefused(self.role, err) from err
            raise
        if self.on_heartbeat:
            self.on_heartbeat(hb)
        if hb.stop and not self.stop_requested.is_set():
            self.stop_requested.set()
            if self.on_stop:
                self.on_stop()

    def _run(self) -> None:
        """Register, then heartbeat. Until the first registration, one attempt every
        `FIRST_REGISTER_INTERVAL_S`: workers start beside the coordinator rather than after
        it, and the first chunk waits for the first registration. A coordinator that does
        not answer then is said once every `QUIET_S`, not at every attempt, and not before
        `QUIET_S` has passed: starting beside it, the first attempts fail as a rule. A
        refused registration (`RegistrationRefused`) ends the loop and goes to `on_refused`
        (a worker service fails: its process exits 1 with the coordinator's reason)."""
        interval = FIRST_REGISTER_INTERVAL_S
        said = time.monotonic()
        while not self._closing.is_set():
            try:
                if self.info is None:
                    self._register(retries=0)
                    interval = self.info.heartbeat_interval_s if self.info else interval
                else:
                    self._heartbeat()
            except RegistrationRefused as refusal:
                self._refused(refusal)
                return
            except HttpError as err:
                if self.info is not None or time.monotonic() - said >= QUIET_S:
                    said = time.monotonic()
                    log.warning("%s could not reach the coordinator: %s", self.role.value,
                                err)
            except Exception:  # the agent outlives anything: a silent worker is reaped
                log.exception("%s agent: unexpected error", self.role.value)
            self._closing.wait(interval)

    def _refused(self, refusal: RegistrationRefused) -> None:
        """Stop registering: the same request would be refused again."""
        self.refusal = refusal
        self._answered.set()
        log.error("%s", refusal)
        if self.on_refused is not None:
            self.on_refused(refusal)

    def end_task(self, task_id: str, error: str | None = None) -> None:
        action = "fail" if error else "finish"
        try:
            self.client.post(f"{API}/tasks/{task_id}/{action}",
                             TaskResult(worker_id=self.worker_id, error=error))
        except HttpError as err:
            log.warning("could not report task %s as %sed: %s", task_id, action, err)

    def close(self, leave: bool = True) -> None:
        self._closing.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        if leave and self.worker_id:
            try:
                self.client.delete(f"{API}/workers/{self.worker_id}", retries=1, timeout_s=3)
            except HttpError as err:
                log.info("leaving: %s", err)
        self.client.close()


class Turns:
    """Turns at the heavy work of roles that share one interpreter, first come first served.

    In its own process a role never waits here (`ALONE`). In the single-process runner the
    collector's env steps and evaluations and the learner's updates are threads of one
    process: run side by side, each gives up the interpreter at every torch call and waits to
    get it back, and both run slower than one after the other. A role holds a turn for one
    unit of its work (a chunk, a sample answer's updates) and never while it waits for the
    other (a permit, data).

    The roles' threads also share one CPU (`settle`): their work is serial anyway, and on one
    CPU each finds the caches the other left warm, where the scheduler would move them from
    CPU to CPU at each hand-over (bench/RESULTS.md, "Roles that take turns share a CPU")."""

    def __init__(self, shared: bool = True) -> None:
        self.shared = shared
        self._cond = threading.Condition()
        self._queue: deque[object] = deque()
        self._held = False
        self.cpu = shared_cpu() if shared else None  # None: where the scheduler likes

    def settle(self) -> None:
        """Run the calling thread (a role's loop, and the threads it starts) on the turns'
        CPU from now on. A role calls it unless it starts workers of its own that should
        spread (env processes, torch's intra-op threads)."""
        if self.cpu is None:
            return
        try:
            os.sched_setaffinity(0, {self.cpu})  # 0: the calling thread (Linux)
        except OSError as err:  # a cpuset that changed since: the scheduler decides
            log.debug("cannot run on CPU %d: %s", self.cpu, err)

    def __enter__(self) -> Turns:
        if not self.shared:
            return self
        me = object()
        with self._cond:
            self._queue.append(me)
            while self._held or self._queue[0] is not me:
                self._cond.wait()
            self._queue.popleft()
            self._held = True
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.shared:
            return
        with self._cond:
            self._held = False
            self._cond.notify_all()


ALONE = Turns(shared=False)  # a role alone in its process


def shared_cpu() -> int | None:
    """The CPU that roles taking turns share: the one this thread runs on now, where the
    kernel's balancing put it, so that several single-process runs on one machine (a
    sweep, a test suite's workers) spread over its CPUs rather than all take the same one;
    None where there is no choice to make (one CPU) or no way to make it (not Linux)."""
    if sys.platform != "linux":
        return None
    allowed = os.sched_getaffinity(0)
    if len(allowed) < 2:
        return None
    try:  # field 39 of a task's stat: the CPU it last ran on (after the name, field 2)
        fields = Path("/proc/thread-self/stat").read_text().rsplit(")", 1)[1].split()
        now = int(fields[36])
    except (OSError, IndexError, ValueError):
        return min(allowed)
    return now if now in allowed else min(allowed)


class WorkerService(ABC):
    """A role's process-wide state: the agent plus whatever loop the role runs. `turns`:
    how it shares its process with other roles (`Turns`; `ALONE` in a process of its own)."""

    role: Role

    def __init__(self, coordinator_url: str, advertise_url: str, worker_id: str | None = None,
                 storage_override: str | None = None, turns: Turns = ALONE) -> None:
        self.storage_override = storage_override
        self.turns = turns
        self.config: RunConfig | None = None
        # Set by whatever serves the app (services/serve.py): how to stop the whole process.
        self.on_fatal: Callable[[], None] | None = None
        # Set once the first registration's config is in hand: the coordinator may push a
        # task before the agent has finished reading the registration's answer.
        self.configured = threading.Event()
        self.agent = WorkerAgent(coordinator_url, self.role, advertise_url, worker_id,
                                 on_registered=self._registered, on_stop=self.on_run_stopped,
                                 status=self.heartbeat_status,
                                 on_heartbeat=self.on_heartbeat,
                                 on_refused=lambda err: self.fail(err, "registration"))

    def _registered(self, info: RegisterResponse) -> None:
        self.config = parse_config(info.config, "coordinator's config")
        self.configured.set()
        self.on_registered(info)

    def wait_config(self, timeout: float = 30.0) -> RunConfig:
        """The run's config, waiting for the registration that brings it if need be."""
        if not self.configured.wait(timeout) or self.config is None:
            raise TimeoutError(f"{self.role.value} has no config from the coordinator "
                               f"after {timeout}s")
        return self.config

    @property
    def storage_url(self) -> str:
        assert self.agent.info is not None
        return self.storage_override or self.agent.info.storage

    def on_registered(self, info: RegisterResponse) -> None:  # noqa: B027 - optional hook
        """Called after every (re-)registration, on the agent's thread."""

    @abstractmethod
    def accept(self, envelope: TaskEnvelope) -> TaskAccepted:
        """Take a task pushed by the coordinator; must return quickly."""

    @abstractmethod
    def status(self) -> dict[str, Any]:
        """What `/status` shows."""

    def heartbeat_status(self) -> dict[str, float]:
        return {}

    def on_heartbeat(self, hb: HeartbeatResponse) -> None:  # noqa: B027 - optional hook
        """Called with every heartbeat's answer, on the agent's thread."""

    def on_run_stopped(self) -> None:  # noqa: B027 - optional hook
        """The coordinator says the run is over."""

    def start(self) -> WorkerService:
        self.agent.start()
        return self

    def fail(self, err: BaseException | None = None, where: str = "") -> None:
        """The role's loop died (of `err`, in `where`): record why for the supervisor
        (`shared/infra/crash.py`) and stop the whole process (`services/serve.py`), which exits 1,
        so the launcher or the orchestrator sees the crash, rather than a process that
        answers /health but does no work."""
        if err is not None:
            write_crash(err, self.role.value, where or self.role.value, self.agent.worker_id)
        log.error("%s is stopping after a fatal error%s", self.role.value,
                  f" in {where}: {describe(err)}" if err is not None else "")
        if self.on_fatal is not None:
            self.on_fatal()

    def close(self) -> None:
        self.agent.close()


def create_worker_app(service: WorkerService) -> Flask:
    app = Flask(f"rlfleet.{service.role.value}")
    install_error_handlers(app)
    install_token_guard(app, load_token())  # the coordinator sends it with every task push
    app.extensions["rlfleet"] = service

    def svc() -> WorkerService:
        return current_app.extensions["rlfleet"]

    @app.get("/health")
    def health():
        return jsonify({"ok": True, "role": service.role.value})

    @app.get("/status")
    def status():
        s = svc()
        return jsonify({"role": s.role.value, "worker_id": s.agent.worker_id,
                        "registered": s.agent.registered.is_set(), **s.status()})

    @app.post("/task")
    def task():
        envelope = parse_body(TaskEnvelope)
        return current_app.response_class(svc().accept(envelope).model_dump_json(),
                                          mimetype="application/json")

    return app
