"""The keeper: as many learner and collector jobs as the run wishes for, in Slurm.

It runs in the coordinator's job, beside the coordinator, and does for Slurm what the
launcher does for `rlfleet up` and the scaler for compose: every `INTERVAL_S` it reads the
run's wish (`GET /api/v1/run`: what `rlfleet scale` last asked for, else the counts the run
was submitted with) and the run's jobs in the queue (`squeue`), then submits the jobs that are
missing and cancels the ones too many. A job Slurm requeues (a failed node, a preemption,
`scontrol requeue`) is still in the queue, so it is waited for, not replaced; a job that
left the queue (it failed and was not requeued, or was cancelled by hand) is replaced.

Cancelling is `scancel`: SIGTERM, and Slurm's `KillWait` of grace before SIGKILL, in which a
collector writes and reports its last chunks and leaves the run. A pending job goes first
(it has nothing to drain), then the newest running one.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

from rlfleet.shared.contract.wire.base import API
from rlfleet.shared.contract.wire.control import RunState
from rlfleet.shared.infra.http import HttpClient, HttpError
from rlfleet.slurm import commands
from rlfleet.slurm.commands import Job, SlurmError
from rlfleet.slurm.plan import SlurmPlan
from rlfleet.slurm.scripts import script

log = logging.getLogger("rlfleet.slurm")

INTERVAL_S = 2.0
WORKER_ROLES = ("learner", "collector")


@dataclass(frozen=True)
class Actions:
    submit: dict[str, int] = field(default_factory=dict)  # role: how many new jobs
    cancel: list[str] = field(default_factory=list)  # job ids


def _job_number(job: Job) -> tuple[int, str]:
    head = job.job_id.split("_")[0].split("+")[0]
    return (int(head) if head.isdigit() else 0, job.job_id)


def reconcile(plan: SlurmPlan, want: dict[str, int], queue: list[Job],
              cancelling: set[str]) -> Actions:
    """What to submit and cancel so that each role has `want[role]` live jobs; jobs being
    cancelled (`cancelling`) count for nothing, so none is replaced twice or cancelled
    again."""
    submit: dict[str, int] = {}
    cancel: list[str] = []
    for role, wanted in want.items():
        live = [j for j in queue if j.name == plan.name(role) and j.live
                and j.job_id not in cancelling]
        if len(live) < wanted:
            submit[role] = wanted - len(live)
        elif len(live) > wanted:
            # pending first (nothing to drain), then the newest
            order = sorted(live, key=lambda j: (j.state == "PENDING", _job_number(j)),
                           reverse=True)
            cancel += [j.job_id for j in order[:len(live) - wanted]]
    return Actions(submit, cancel)


class Keeper:
    """Follows the run's wish with jobs; `tick` once per interval, from the coordinator job's
    main loop. Returns the run's state from each tick, or None when the coordinator did not
    answer (nothing is changed then: the queue is kept as it is)."""

    def __init__(self, plan: SlurmPlan, coordinator_url: str) -> None:
        self.plan = plan
        self.client = HttpClient(coordinator_url, timeout_s=5, retries=1)
        self.cancelling: set[str] = set()

    def want(self, state: RunState) -> dict[str, int]:
        collectors = (state.collectors_desired if state.collectors_desired is not None
                      else self.plan.collectors)
        learners = (state.learners_desired if state.learners_desired is not None
                    else self.plan.learners)
        return {"learner": learners, "collector": collectors}

    def run_state(self) -> RunState | None:
        try:
            return self.client.get(f"{API}/run", RunState)
        except HttpError as err:
            log.warning("keeper: the coordinator did not answer: %s", err)
            return None

    def queue(self) -> list[Job]:
        return commands.jobs([self.plan.name(r) for r in WORKER_ROLES])

    def tick(self) -> RunState | None:
        state = self.run_state()
        if state is None or state.state == "stopped":
            return state
        try:
            queue = self.queue()
        except SlurmError as err:
            log.warning("keeper: %s", err)
            return state
        listed = {j.job_id for j in queue if j.live}
        self.cancelling &= listed  # gone from the queue: forgotten
        actions = reconcile(self.plan, self.want(state), queue, self.cancelling)
        for role, n in actions.submit.items():
            for _ in range(n):
                try:
                    job_id = commands.sbatch(str(script(self.plan, role)), env=clean_env())
                except SlurmError as err:
                    log.warning("keeper: could not submit a %s job: %s", role, err)
                    break
                log.info("keeper: submitted %s job %s", role, job_id)
        if actions.cancel:
            try:
                commands.cancel(actions.cancel)
                self.cancelling.update(actions.cancel)
                log.info("keeper: cancelled %s (more than the run wishes for)",
                         ", ".join(actions.cancel))
            except SlurmError as err:
                log.warning("keeper: %s", err)
        return state

    def worker_jobs(self) -> list[Job]:
        try:
            return [j for j in self.queue() if j.live]
        except SlurmError as err:
            log.warning("keeper: %s", err)
            return []

    def close(self) -> None:
        self.client.close()


def clean_env() -> dict[str, str]:
    """This job's environment without the variables Slurm set for it: a job submitted from
    inside a job must not inherit its id, nodes or CPU count (`SLURM_CONF` stays)."""
    return {k: v for k, v in os.environ.items()
            if not (k.startswith(("SLURM_", "SBATCH_", "SRUN_")) and k != "SLURM_CONF")}
