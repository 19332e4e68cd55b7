"""The watch loop of `rlfleet up`: the run's status read four times a second until the run
stops (solved or at its budget) or a stop signal comes, with crashed children restarted,
the cluster scaled to the run's wish and the progress line kept current in between."""

from __future__ import annotations

import time

from rlfleet.local.progress import Progress, Say
from rlfleet.local.startup import Startup
from rlfleet.local.summary import Ending
from rlfleet.local.supervisor import LocalCluster, StopSignals, scale, supervise
from rlfleet.shared.contract.wire.base import API
from rlfleet.shared.infra.http import HttpClient, HttpError

POLL_S = 0.25  # between status reads
DOWN_POLL_S = 0.5  # between reads while the coordinator does not answer


class StatusPoller:
    """Reads the run's status for the watch loop. While the coordinator is down (crashed and
    being restarted) reads fail: that is an outage to wait out, not the end of the run, and
    it is said once when it starts and once when it ends, not on every poll."""

    def __init__(self, url: str, say: Say) -> None:
        self.client = HttpClient(url, timeout_s=5, retries=2)
        self.say = say
        self.down_since: float | None = None

    def poll(self) -> dict | None:
        try:
            status = self.client.get(f"{API}/status")
        except HttpError as err:
            if self.down_since is None:
                self.down_since = time.monotonic()
                self.say(f"[yellow]coordinator status unavailable: {err}[/]")
            return None
        if self.down_since is not None:
            self.say(f"coordinator status available again after "
                     f"{time.monotonic() - self.down_since:.1f} s")
            self.down_since = None
        return status

    def close(self) -> None:
        self.client.close()


def wish_collectors(url: str, n: int) -> None:
    """Ask the coordinator for `n` collectors, replacing the wish it restored."""
    client = HttpClient(url, timeout_s=10, retries=5)
    try:
        client.post(f"{API}/scale", {"collectors": n})
    finally:
        client.close()


class Watch:
    """One run watched. `status` is the last status read (None until one is), kept for the
    summary however the loop ends, a crash included."""

    def __init__(self, cluster: LocalCluster, progress: Progress, signals: StopSignals,
                 startup: Startup) -> None:
        self.cluster = cluster
        self.progress = progress
        self.signals = signals
        self.startup = startup
        self.status: dict | None = None
        self.poller: StatusPoller | None = None

    def run(self, started: float) -> Ending:
        """Watch until the run ends; how it ended. Raises `ChildFailed` (`RestartsExhausted`)
        when a child cannot be restarted. `started`: when the cluster started, for the
        progress line's clock."""
        assert self.cluster.coordinator is not None
        say = self.progress.say
        self.poller = StatusPoller(self.cluster.coordinator.url, say)
        first_chunk = self.startup.first_chunk
        with self.progress.live():
            while True:
                if self.signals.received:
                    return Ending.interrupted()
                supervise(self.cluster, say)
                asked = time.monotonic()
                status = self.poller.poll()
                if status is None:
                    time.sleep(DOWN_POLL_S)
                    continue
                self.status = status
                if first_chunk is not None and not self.cluster.restarts["coordinator"]:
                    first_chunk.observe(status, asked, time.monotonic())
                scale(self.cluster, status, say)
                self.progress.show(status, time.monotonic() - started)
                if status["run"]["state"] == "stopped":
                    self.cluster.stopping = True  # workers may leave now: no restarts
                    say(f"run stopped: {status['run']['stop_reason']}")
                    return Ending.stopped(status["run"]["solved"])
                time.sleep(POLL_S)

    def settle(self, ending: Ending) -> None:
        """Once the workers have stopped: the summary's counters as they are now that
        nothing more can arrive (chunks that workers delivered after the stop count in them,
        as they do in league.json; the rest, evaluations and the learner group, stays as it
        was when the run stopped). An interrupted run is not asked again."""
        if self.poller is None:
            return
        status = self.status
        final = (self.poller.poll() if status is not None
                 and ending.outcome != "interrupted" else None)
        if status is not None and final is not None and "counters" in final:
            self.status = {**status, "counters": final["counters"]}
        self.poller.close()
