"""`rlfleet scaler`: collectors as containers, following the run's wish.

Under `rlfleet up` the launcher starts and drains collector processes to match what
`rlfleet scale --collectors N` asked the coordinator for. Under compose nothing did: compose
only scales when a person runs `docker compose up --scale`. The scaler is that launcher for
containers. It reads the wish from the coordinator (`GET /api/v1/run`) and adds or removes
containers of the collector service through the Docker Engine API (docker-py), so the same
command scales both.

A new container is a copy of one the service already has (image, command, environment,
mounts, network, restart policy, health check), labelled as compose labels its own replicas:
`docker compose ps` lists it and `docker compose down` removes it. A removed container is
stopped with SIGTERM and a grace period, in which the collector writes and reports its last
chunks and leaves the run (its `stop_grace_period` under compose), then deleted.

The scaler needs the Docker socket, read-write: whoever holds it is root on the host. That is
why it is an optional compose profile (`--profile scaler`), not part of the default stack.

An optional rule scales without anyone asking: `--min-env-steps-per-s X --max-collectors M`
adds a collector when the run has made fewer than X env steps/s for a whole window with every
wished-for collector running, up to M (the coordinator's wish is set, so `rlfleet status`
shows what the rule decided, and a person's `rlfleet scale` overrides it).
"""

from __future__ import annotations

import logging
import signal
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("rlfleet.scaler")

PROJECT = "com.docker.compose.project"
SERVICE = "com.docker.compose.service"
NUMBER = "com.docker.compose.container-number"
ONEOFF = "com.docker.compose.oneoff"
ADDED_BY = "org.rlfleet.added-by"  # containers this scaler made (for `docker ps --filter`)
PRESENT = ("created", "running", "restarting")  # a container that is, or will be, working


class ScalerError(RuntimeError):
    """The service cannot be scaled (no container to copy, no project to find)."""


def own_project(client: Any) -> str:
    """The compose project of the container this process runs in: its hostname is its
    container id (compose does not set one)."""
    try:
        me = client.containers.get(socket.gethostname())
    except Exception as err:  # docker.errors.NotFound, APIError
        raise ScalerError("not running in a compose container: give --project") from err
    project = me.labels.get(PROJECT)
    if not project:
        raise ScalerError(f"container {me.name} has no {PROJECT} label: give --project")
    return project


class ComposeService:
    """The containers of one compose service, added and removed through the Engine API."""

    def __init__(self, client: Any, project: str, service: str, grace_s: float = 30.0) -> None:
        self.client = client
        self.project = project
        self.service = service
        self.grace_s = grace_s

    def containers(self, everything: bool = False) -> list[Any]:
        """The service's replicas by container number; only the present ones unless
        `everything` (stopped, exited and killed ones too)."""
        found = self.client.containers.list(all=True, filters={"label": [
            f"{PROJECT}={self.project}", f"{SERVICE}={self.service}"]})
        found = [c for c in found if c.labels.get(ONEOFF, "False") != "True"]
        if not everything:
            found = [c for c in found if c.status in PRESENT]
        return sorted(found, key=_number)

    def reconcile(self, desired: int) -> tuple[list[str], list[str]]:
        """Add or remove containers until `desired` are present: (added, removed) names.
        Removal drains them in parallel, the highest numbers first."""
        present = self.containers()
        if desired > len(present):
            return [self._add() for _ in range(desired - len(present))], []
        if desired < len(present):
            victims = present[desired:][::-1]
            with ThreadPoolExecutor(max_workers=len(victims)) as pool:
                return [], list(pool.map(self._remove, victims))
        return [], []

    def _add(self) -> str:
        everything = self.containers(everything=True)
        if not everything:
            raise ScalerError(f"service {self.service!r} of project {self.project!r} has no "
                              "container to copy: start one with `docker compose up`")
        template = self._template(everything)
        number = max(_number(c) for c in everything) + 1
        name = f"{self.project}-{self.service}-{number}"
        cfg, host = template.attrs["Config"], template.attrs["HostConfig"]
        labels = dict(cfg.get("Labels") or {})
        labels.update({NUMBER: str(number), ADDED_BY: "rlfleet-scaler"})
        api = self.client.api
        network = next(iter(template.attrs["NetworkSettings"]["Networks"]))
        created = api.create_container(
            image=cfg["Image"], command=cfg.get("Cmd"), entrypoint=cfg.get("Entrypoint"),
            environment=cfg.get("Env"), labels=labels, name=name,
            # The collector advertises its hostname and uses it as its worker id; the
            # container's name is what the network's DNS answers for.
            hostname=name, user=cfg.get("User") or None,
            working_dir=cfg.get("WorkingDir") or None, stop_signal=cfg.get("StopSignal"),
            healthcheck=cfg.get("Healthcheck"),
            host_config=api.create_host_config(
                restart_policy=host.get("RestartPolicy"), binds=host.get("Binds"),
                mounts=host.get("Mounts"), init=host.get("Init"),
                log_config=host.get("LogConfig")),
            networking_config=api.create_networking_config({
                network: api.create_endpoint_config(aliases=[self.service, name])}))
        api.start(created["Id"])
        log.info("added %s", name)
        return name

    @staticmethod
    def _template(containers: list[Any]) -> Any:
        """A running replica if there is one (its config is the current one)."""
        running = [c for c in containers if c.status == "running"]
        return (running or containers)[0]

    def _remove(self, container: Any) -> str:
        """SIGTERM, the grace period to drain, then delete (its logs go with it)."""
        log.info("draining %s (grace %.0f s)", container.name, self.grace_s)
        container.stop(timeout=int(self.grace_s))
        container.reload()
        code = container.attrs["State"]["ExitCode"]
        if code != 0:
            log.warning("%s exited with code %s while draining", container.name, code)
        # Its logs go with it: keep the collector's own account of its drain.
        tail = container.logs(tail=50).decode(errors="replace").splitlines()
        drained = [line for line in tail if "drained:" in line]
        log.info("%s %s", container.name,
                 drained[-1][drained[-1].index("drained:"):] if drained else "left no drain line")
        container.remove()
        log.info("removed %s", container.name)
        return container.name


def _number(container: Any) -> int:
    try:
        return int(container.labels.get(NUMBER, "0"))
    except ValueError:
        return 0


@dataclass
class InsertRateRule:
    """Add a collector while the run makes fewer than `min_rate` env steps/s, up to `most`.
    Decides only after `window_s` of steady membership, so a newcomer is given time to start
    and a short stall (a learner restarting) does not add collectors for ever."""

    min_rate: float
    most: int
    window_s: float = 30.0
    _since: float | None = None
    _count: int | None = None

    def decide(self, now: float, rate: float, present: int, wanted: int) -> int | None:
        """The new wish, or None to keep it."""
        if present != wanted or self._count != present:
            self._since, self._count = now, present  # membership changed: start over
            return None
        if now - (self._since if self._since is not None else now) < self.window_s:
            return None
        self._since = now
        if rate < self.min_rate and present < self.most:
            return present + 1
        return None


class Scaler:
    """The loop: read the wish, reconcile, sleep. Never raises out of a round: a coordinator
    that is restarting, or an engine that refused one call, is retried next round."""

    def __init__(self, service: ComposeService, coordinator: Any, interval_s: float = 2.0,
                 rule: InsertRateRule | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.service = service
        self.coordinator = coordinator  # rlfleet.shared.infra.http.HttpClient
        self.interval_s = interval_s
        self.rule = rule
        self.clock = clock
        self.stop = threading.Event()

    def round(self) -> tuple[list[str], list[str]]:
        from rlfleet.shared.contract.wire.base import API

        run = self.coordinator.get(f"{API}/run")
        wanted = run.get("collectors_desired")
        if self.rule is not None:
            present = len(self.service.containers())
            status = self.coordinator.get(f"{API}/status")
            rate = float(status["rates"]["env_steps_per_s"])
            target = self.rule.decide(self.clock(), rate, present,
                                      present if wanted is None else wanted)
            if target is not None:
                log.info("%.0f env steps/s < %.0f: asking for %d collectors", rate,
                         self.rule.min_rate, target)
                self.coordinator.post(f"{API}/scale", {"collectors": target})
                wanted = target
        if wanted is None or run.get("state") == "stopped":
            return [], []
        return self.service.reconcile(int(wanted))

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                added, removed = self.round()
                if added or removed:
                    log.info("collectors: added %s, removed %s", added, removed)
            except Exception as err:  # noqa: BLE001 - logged, retried next round
                log.warning("scaling round failed (retrying): %s", err)
            self.stop.wait(self.interval_s)


def main(args: Any) -> int:
    import docker

    from rlfleet.shared.infra.http import HttpClient

    client = docker.from_env()
    project = args.project or own_project(client)
    service = ComposeService(client, project, args.service, grace_s=args.grace_s)
    rule = (InsertRateRule(args.min_env_steps_per_s, args.max_collectors, args.rule_window_s)
            if args.min_env_steps_per_s else None)
    coordinator = HttpClient(args.coordinator, timeout_s=10, retries=3)
    scaler = Scaler(service, coordinator, interval_s=args.interval_s, rule=rule)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: scaler.stop.set())
    log.info("scaling service %r of compose project %r after %s", args.service, project,
             args.coordinator)
    scaler.run()
    coordinator.close()
    return 0
