"""What the coordinator shows of a run: the `/status` document, the figures Prometheus
scrapes, the flat scalars the scheduler logs each tick, and the recent rates of env steps
and train iterations.

Read-only over the parts it is given, so the parts that answer requests (`workers.py`,
`dataplane.py`, `control.py`) stay about changing state; a figure added for people to see
goes here. The `/status` document is `wire.status.Status`, its one definition. The parts' own
records in it (a worker's, a task's, the ledger, the learner group's, the league's) are
checked against its sub-models with unknown fields forbidden: a figure a part adds must be
added to the schema too, where clients and the OpenAPI document see it, or `/status` fails
(and every test that reads it).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from pydantic import BaseModel

from rlfleet.coordinator.evaluation import EvaluationSchedule
from rlfleet.coordinator.garbage import OrphanCollector
from rlfleet.coordinator.health import RunHealth
from rlfleet.coordinator.learner_group import LearnerGroup
from rlfleet.coordinator.membership import Membership
from rlfleet.coordinator.state import CoordinatorState
from rlfleet.coordinator.tasks import TaskTable
from rlfleet.shared.contract.wire.base import Role, TaskKind
from rlfleet.shared.contract.wire.evaluation import EvaluationResult
from rlfleet.shared.contract.wire.membership import WorkerResources
from rlfleet.shared.contract.wire.status import (
    CollectStats,
    LeagueSummary,
    LearnerGroupStatus,
    Ledger,
    ReplaySize,
    RunCounters,
    RunInfo,
    RunRates,
    Status,
)
from rlfleet.shared.contract.wire.views import BufferStats, TaskInfo, WorkerInfo
from rlfleet.shared.infra.resources import slurm_placement
from rlfleet.shared.league.matchmaking import Matchmaker
from rlfleet.shared.replay.replay import Replay, UnknownBuffer
from rlfleet.shared.run.config import RunConfig

M = TypeVar("M", bound=BaseModel)

RATE_WINDOW_S = 5.0  # the rates are over this many seconds of scheduler ticks


def buffer_metrics(buffers: dict[str, dict]) -> dict[str, float]:
    """Buffer stats as flat metrics, `buffer/<name>/<stat>` (numeric stats only)."""
    return {f"buffer/{name}/{key}": float(value) for name, stats in buffers.items()
            for key, value in stats.items() if isinstance(value, int | float)}


def _checked(model: type[M], record: dict[str, Any]) -> M:
    """A part's record as its `/status` sub-model, refusing fields the schema lacks."""
    return model.model_validate(record, extra="forbid")


@dataclass(frozen=True)
class Scrape:
    """The run's figures for one Prometheus scrape: counters and buffer sizes copied under
    the state's lock, so one scrape describes one moment."""

    workers_alive: dict[Role, int]
    # (worker id, role, resources) of each alive worker that reported its resources
    resources: list[tuple[str, Role, WorkerResources]]
    buffer_sizes: dict[str, int]  # items per buffer (queue buffers: transitions queued)
    buffer_chunks: int
    env_steps: int
    train_iterations: int
    policy_version: int
    chunks_accepted: int
    episodes: int
    released: dict[str, int]  # the ledger: chunks let go of, by reason
    orphans_deleted: int
    latest_evaluation: EvaluationResult | None
    learner_group: dict[str, Any]  # `LearnerGroup.status`
    solved: bool
    stopped: bool


class Readout:
    def __init__(self, cfg: RunConfig, storage_url: str, state: CoordinatorState, *,
                 replay: Replay, members: Membership, tasks: TaskTable, group: LearnerGroup,
                 evaluations: EvaluationSchedule, matchmaker: Matchmaker | None,
                 garbage: OrphanCollector, health: RunHealth | None = None) -> None:
        self.cfg = cfg
        self.health = health
        self.storage_url = storage_url  # without its password
        self.state = state
        self.replay = replay
        self.members = members
        self.tasks = tasks
        self.group = group
        self.evaluations = evaluations
        self.matchmaker = matchmaker
        self.garbage = garbage  # chunks nobody announced: the ledger's orphans
        self.slurm = slurm_placement()  # where Slurm runs this coordinator, if it does
        self._rates: deque[tuple[float, int, int]] = deque(maxlen=64)

    # -- rates ------------------------------------------------------------------------------

    def sample_rates(self, now: float) -> None:
        """One point of the rate window (each scheduler tick)."""
        self._rates.append((now, self.state.env_steps, self.state.train_iterations))

    def rates(self) -> tuple[float, float]:
        """env steps/s and train iterations/s over the last few seconds."""
        # a copy first (in C, under the interpreter lock): the scheduler appends meanwhile
        samples = [s for s in tuple(self._rates) if s[0] >= self.state.clock() - RATE_WINDOW_S]
        if len(samples) < 2:
            return 0.0, 0.0
        (t0, e0, i0), (t1, e1, i1) = samples[0], samples[-1]
        dt = max(t1 - t0, 1e-9)
        return (e1 - e0) / dt, (i1 - i0) / dt

    # -- buffers ----------------------------------------------------------------------------

    def buffers(self) -> dict[str, dict[str, float | str]]:
        """Each buffer's kind and statistics (`GET /buffers`). Each call is a tick of the
        buffers' rate windows."""
        with self.state.cond:
            return self.replay.stats()

    def buffer_chunks(self, name: str) -> list[str]:
        """The chunk ids a buffer indexes, once per index entry."""
        with self.state.cond:
            buf = self.replay.buffers.get(name)
            if buf is None:
                raise UnknownBuffer(name, "name")
            return buf.chunk_occurrences()

    # -- the scheduler's `info` record ------------------------------------------------------

    def info_scalars(self) -> dict[str, float]:
        """The `info` scope: buffers, counters and the cluster, flat."""
        s = self.state
        with s.cond:
            buffers = self.replay.stats()
            ledger = self.replay.ledger(s.chunks_accepted)
            counters = {"env_steps": s.env_steps,
                        "frames": s.env_steps * self.cfg.env.frame_skip,
                        "train_iterations": s.train_iterations,
                        "policy_version": s.policy_version,
                        "chunks_accepted": s.chunks_accepted, "episodes": s.episodes}
        out = buffer_metrics(buffers)
        out.update({f"counters/{k}": float(v) for k, v in counters.items()})
        for key in ("acknowledged", "in_buffers", "evicted", "consumed"):
            out[f"ledger/{key}"] = float(ledger[key])
        out.update({f"ledger/dropped/{k}": float(v) for k, v in ledger["dropped"].items()})
        out["ledger/orphans_deleted"] = float(self.garbage.orphans_deleted)
        for role in (Role.COLLECTOR, Role.LEARNER):
            out[f"cluster/{role.value}s_alive"] = float(len(self.members.alive(role)))
        active = [r for r in self.tasks.all() if r.active]
        out["cluster/tasks_active"] = float(len(active))
        for kind in TaskKind:
            out[f"cluster/tasks_{kind.value}"] = float(sum(r.kind is kind for r in active))
        out.update(self.group.scalars())
        if self.matchmaker is not None:
            out.update(self.matchmaker.scalars())
        return out

    # -- Prometheus -------------------------------------------------------------------------

    def scrape(self) -> Scrape:
        """A few numbers copied, never `status()`: its `replay.stats()` would add ticks to
        the buffers' rate windows with every scrape."""
        s = self.state
        with s.cond:
            sizes = {name: len(buf) for name, buf in self.replay.buffers.items()}
            chunks = len(self.replay.registry)
            env_steps, iterations = s.env_steps, s.train_iterations
            version, accepted, episodes = s.policy_version, s.chunks_accepted, s.episodes
            solved, stopped = s.solved, s.stopped
            released = dict(self.replay.released_by)
            group = self.group.status(s.started_at)
        evaluations = self.evaluations.evaluations
        latest = evaluations[-1] if evaluations else None  # a deque: [-1] is atomic
        alive = dict.fromkeys(Role, 0)
        resources = []
        for w in self.members.alive():
            alive[w.role] += 1
            if w.resources is not None:
                resources.append((w.worker_id, w.role, w.resources))
        return Scrape(workers_alive=alive, resources=resources, buffer_sizes=sizes,
                      buffer_chunks=chunks, env_steps=env_steps, train_iterations=iterations,
                      policy_version=version, chunks_accepted=accepted, episodes=episodes,
                      released=released, orphans_deleted=self.garbage.orphans_deleted,
                      latest_evaluation=latest, learner_group=group, solved=solved,
                      stopped=stopped)

    # -- /status ----------------------------------------------------------------------------

    def _metrics(self, buffers: dict, returns: list[float], steps_per_s: float,
                 latest: EvaluationResult | None) -> dict[str, int | float]:
        out: dict[str, int | float] = dict(buffer_metrics(buffers))
        out["collect/env_steps_per_s"] = round(steps_per_s, 1)
        if returns:
            out.update({"collect/return_min": min(returns),
                        "collect/return_mean": float(np.mean(returns)),
                        "collect/return_max": max(returns),
                        "collect/episode_length": float(np.mean(self.state.recent_lengths))})
        out.update({f"train/{k}": v for k, v in self.state.learner_metrics.items()})
        for mode in ("deterministic", "stochastic"):
            summary = getattr(latest, mode) if latest is not None else None
            for key, value in (summary.model_dump(exclude={"info"}) if summary else {}).items():
                if value is not None:  # success_rate of an env without `is_success`
                    out[f"eval/{mode}/{key}"] = value
            for key, value in (summary.info if summary else {}).items():  # eval.info_keys
                out[f"eval/{mode}/info/{key}"] = value
        return out

    def status(self) -> Status:
        """The whole run at one glance (`GET /status`)."""
        s = self.state
        now = s.clock()
        steps_per_s, iters_per_s = self.rates()
        evals = self.evaluations
        latest = evals.evaluations[-1] if evals.evaluations else None
        returns = list(s.recent_returns)
        with s.cond:
            buffers = self.replay.stats()
            ledger = self.replay.ledger(s.chunks_accepted)
            group = self.group.status(s.started_at)
        ledger.update(orphans_deleted=self.garbage.orphans_deleted,
                      unannounced=self.garbage.unannounced,
                      journal_generation=self.replay.generation)
        first_chunk_s = s.first_chunk_s()
        return Status(
            run=RunInfo(name=self.cfg.name, state=s.phase, paused=s.paused,
                        collectors_desired=s.collectors_desired,
                        learners_desired=self.group.learners_desired,
                        stop_reason=s.stop_reason, solved=s.solved,
                        wall_seconds=round(s.wall_seconds(now), 3),
                        stop_value=self.cfg.eval.stop_value, storage=self.storage_url,
                        # workers' start-up (imports, registration) ends here
                        first_chunk_s=(round(first_chunk_s, 3) if first_chunk_s is not None
                                       else None), slurm=self.slurm),
            counters=RunCounters(env_steps=s.env_steps, train_iterations=s.train_iterations,
                                 granted_batches=s.granted_batches,
                                 policy_version=s.policy_version,
                                 chunks_accepted=s.chunks_accepted, episodes=s.episodes),
            rates=RunRates(env_steps_per_s=round(steps_per_s, 1),
                           train_iterations_per_s=round(iters_per_s, 1)),
            buffer=ReplaySize(size=self.replay.size(), chunks=len(self.replay.registry)),
            buffers={name: BufferStats.model_validate(stats) for name, stats in buffers.items()},
            # Flat scalars under the names the logger uses (`scope/...`).
            metrics=self._metrics(buffers, returns, steps_per_s, latest),
            collect=CollectStats(
                episode_return_mean=float(np.mean(returns)) if returns else None,
                episode_length_mean=(float(np.mean(s.recent_lengths)) if returns else None)),
            train=s.learner_metrics,
            workers=[_checked(WorkerInfo, w.to_json(now)) for w in self.members.all()],
            tasks=[_checked(TaskInfo, r.to_json()) for r in self.tasks.all() if r.active],
            latest_evaluation=latest,
            best_evaluation=evals.best_evaluation,
            ledger=_checked(Ledger, ledger),
            learner_group=_checked(LearnerGroupStatus, group),
            league=(_checked(LeagueSummary, self.matchmaker.view()) if self.matchmaker
                    else None),
            alerts=(self.health.alerts(self.members, collecting=s.phase == "running")
                    if self.health is not None else []),
        )
