"""The coordinator: membership, tasks, the replay (buffers and rate limits) and the run's state.

Routes (`coordinator/routes.py`) are thin: they validate a body and call one method here.
`Coordinator` is the assembly: it builds the parts in dependency order, each handed what it
uses, and passes each request to the part that owns it:

- `CoordinatorState` (`state.py`): the run's counters and flags and the one lock over them,
  the replay and the learner group. Built first: every part shares it, and the commander's
  `EnvSettings` stops the run through it.
- *membership and tasks*, `Workers` (`workers.py`): registration, heartbeats, leaving, dead
  workers, handing tasks out and their ends, the learner group's sync; over `Membership`,
  the `TaskTable`, the `LearnerGroup` and the `TaskDispatcher` (which pushes tasks).
- *the data plane*, `DataPlane` (`dataplane.py`) and `Sampler` (`sampling.py`): chunk
  reports, collect permits, samples (group shards too), learners' progress, buffers cleared
  and loaded; over the `Replay`, changed through the `Intake` (`intake.py`) whose changes the
  journal replays.
- *run control*, `RunControl` (`control.py`): stop, pause, scale, evaluations reported, the
  stop rules and the scheduler thread.
- `Durability` (`durability.py`: the journal, versioned snapshots, restore and the janitor),
  the `EvaluationSchedule`, the `Readout` (`readout.py`: what `/status`, the run log and
  Prometheus show).

A resumed run is restored into the assembled whole, a step after construction (`_restore`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from rlfleet.coordinator.admission import WorkerNetworks
from rlfleet.coordinator.batch_log import BatchLog
from rlfleet.coordinator.control import RunControl
from rlfleet.coordinator.dataplane import DataPlane
from rlfleet.coordinator.dispatcher import TaskDispatcher
from rlfleet.coordinator.durability import Durability
from rlfleet.coordinator.env_settings import EnvSettings
from rlfleet.coordinator.episodes import EpisodeTable
from rlfleet.coordinator.evaluation import EvaluationSchedule
from rlfleet.coordinator.garbage import OrphanCollector
from rlfleet.coordinator.health import RunHealth
from rlfleet.coordinator.intake import Intake
from rlfleet.coordinator.learner_group import LearnerGroup, StaleGeneration
from rlfleet.coordinator.membership import Membership, UnknownWorker, Worker
from rlfleet.coordinator.readout import Readout
from rlfleet.coordinator.runlog import RunLog
from rlfleet.coordinator.sampling import RateLimited, SampleGrant, Sampler
from rlfleet.coordinator.snapshot import SnapshotParts
from rlfleet.coordinator.state import CoordinatorState
from rlfleet.coordinator.tasks import TaskRecord, TaskTable, UnknownTask
from rlfleet.coordinator.workers import Workers, WrongWorker
from rlfleet.shared.contract.commander import load_commander
from rlfleet.shared.contract.wire.control import RunState
from rlfleet.shared.contract.wire.evaluation import EvaluationReport, EvaluationResult
from rlfleet.shared.contract.wire.experience import (
    ChunkReport,
    ChunkReportResponse,
    CollectPermitRequest,
    CollectPermitResponse,
)
from rlfleet.shared.contract.wire.group import GroupAssignment, GroupSyncRequest
from rlfleet.shared.contract.wire.membership import (
    HeartbeatRequest,
    HeartbeatResponse,
    RegisterRequest,
    RegisterResponse,
)
from rlfleet.shared.contract.wire.sampling import LearnInfo, LearnInfoResponse, SampleRequest
from rlfleet.shared.contract.wire.status import Status
from rlfleet.shared.contract.wire.views import BufferCleared, BufferLoaded, BufferLoadRequest
from rlfleet.shared.infra.auth import load_token
from rlfleet.shared.infra.storage import open_storage
from rlfleet.shared.infra.storage.credentials import redact
from rlfleet.shared.league.matchmaking import Matchmaker
from rlfleet.shared.replay.replay import Replay, UnknownBuffer
from rlfleet.shared.run.config import RunConfig
from rlfleet.shared.telemetry.rotating import MB


class Coordinator:
    """The parts, assembled, and the calls the routes make, each passed to its part.

    The parts are built in dependency order, each before anything that refers to it, and
    each handed what it uses: none is changed after it is made. A resumed run
    (`resume=True`) is then restored into the whole, or starts fresh when storage has no
    snapshot, and only then is the run log opened, at the step the run continues from."""

    def __init__(self, cfg: RunConfig, storage_url: str, run_dir: str | Path | None = None,
                 clock: Callable[[], float] = time.monotonic, resume: bool = False) -> None:
        # Whatever the coordinator shows or hands out names storage without its password
        # (workers find it themselves: shared/infra/storage/credentials.py).
        if cfg.storage and redact(cfg.storage) != cfg.storage:
            cfg = cfg.with_overrides(storage=redact(cfg.storage))
        self.cfg = cfg
        self.storage_url = redact(storage_url)
        token = load_token()  # before anything is opened: a misconfigured token fails here
        self.run_dir = Path(run_dir) if run_dir else None
        self.storage = open_storage(storage_url, cfg.name)  # the password, if any, stays here
        self.clock = clock
        # The counters, and the lock that guards them and the replay and orders sampling
        # against inserts; first, so the parts that stop the run get its `stop`.
        self.state = state = CoordinatorState(clock)
        # -- what the parts share ----------------------------------------------------------
        self.members = Membership(cfg.coordinator.heartbeat_timeout_s, clock)
        self.admission = WorkerNetworks(cfg.coordinator.worker_networks)
        self.tasks = TaskTable(cfg.collector)  # Ape-X slots on collect tasks, if asked
        # logging.batch_log: every sample handed out counted, per-sample values written
        self.batch_log = BatchLog(cfg.logging.batch_log, self.run_dir)
        self.replay = Replay(cfg, self.storage,
                             self.batch_log if self.batch_log.active else None)
        self.group = LearnerGroup(cfg, clock)
        self.dispatcher = TaskDispatcher(cfg, self.members, self.tasks, token)
        # the run's commander (`coordinator.commander`): env settings of tasks
        self.env_settings = EnvSettings(load_commander(cfg), state.stop)
        self.runlog = RunLog(cfg, self.run_dir, open_logger=False)  # opened by `_restore`
        self.health = RunHealth(cfg.learner.data_shortage_warn_s)  # alerts in /status
        max_mb = cfg.logging.episodes_max_mb
        self.episode_table = EpisodeTable(
            cfg.name, self.run_dir if cfg.logging.episodes else None,
            None if max_mb is None else max(1, int(max_mb * MB)))
        # self-play: the league, its opponents and snapshots (None: a single-agent run)
        self.matchmaker = (Matchmaker(cfg, self.storage, self.run_dir)
                           if cfg.league is not None else None)
        self.eval_schedule = evaluations = EvaluationSchedule(
            cfg, self.tasks, self.members, self.storage, self.run_dir, self.dispatcher.push,
            battles=self.matchmaker.eval_opponents if self.matchmaker else None,
            solves=self.matchmaker.solved if self.matchmaker else None,
            show_video=self.runlog.on_video,
            env_kwargs=self.env_settings.evaluate_kwargs, score=self.env_settings.score)
        # -- crash safety ------------------------------------------------------------------
        self.intake = Intake(state, self.replay, self.members, self.matchmaker)
        self.garbage = OrphanCollector(cfg.coordinator.orphan_grace_s, self.storage, state,
                                       self.replay)
        self.durability = Durability(
            cfg, self.storage, self.storage_url, state, self.replay, intake=self.intake,
            garbage=self.garbage, snapshots=SnapshotParts(
                state, self.replay, self.tasks, evaluations, self.matchmaker,
                self.env_settings))
        self.readout = Readout(cfg, self.storage_url, state, replay=self.replay,
                               members=self.members, tasks=self.tasks, group=self.group,
                               evaluations=evaluations, matchmaker=self.matchmaker,
                               garbage=self.garbage, health=self.health)
        # -- the three parts that answer requests ------------------------------------------
        self.workers = Workers(
            cfg, self.storage_url, state, members=self.members,
            admission=self.admission, tasks=self.tasks,
            replay=self.replay, group=self.group, dispatcher=self.dispatcher,
            env_settings=self.env_settings, evaluations=evaluations,
            matchmaker=self.matchmaker)
        self.control = RunControl(
            cfg, clock, state, members=self.members, workers=self.workers, tasks=self.tasks,
            replay=self.replay, group=self.group, dispatcher=self.dispatcher,
            env_settings=self.env_settings, evaluations=evaluations,
            matchmaker=self.matchmaker, durability=self.durability, readout=self.readout,
            runlog=self.runlog, episode_table=self.episode_table, batch_log=self.batch_log)
        self.sampler = Sampler(cfg, clock, state, members=self.members, replay=self.replay,
                               group=self.group, durability=self.durability)
        self.data = DataPlane(
            clock, state, members=self.members, workers=self.workers, replay=self.replay,
            group=self.group, intake=self.intake, durability=self.durability,
            evaluations=evaluations, matchmaker=self.matchmaker, readout=self.readout,
            runlog=self.runlog, episode_table=self.episode_table, batch_log=self.batch_log,
            health=self.health, wake_scheduler=self.control.wake)
        self._started = False
        self._restore(resume)

    def _restore(self, resume: bool) -> None:
        """Continue the run from storage (`resume`: its newest snapshot and the journals
        after it), or start it fresh, discarding whatever an older run journalled; then
        open the run log where the run continues."""
        resumed = self.durability.restore() if resume else None
        if resumed is None:
            self.durability.discard_journals()
        elif resumed.snapshot is not None:  # the curriculum goes on at the level it reached
            self.env_settings.load_state(resumed.snapshot.commander)
        self.runlog.open(self.state.env_steps if resumed is not None else None)

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> Coordinator:
        if not self._started:
            self._started = True
            self.control.start()
            self.dispatcher.start()
            self.durability.start()
        return self

    def close(self) -> None:
        self.state.close()  # long polls answer at once; the scheduler's loop ends
        self.control.wake()
        self.dispatcher.stop()
        if self._started:
            self.control.join(timeout=5)
            self.dispatcher.join(timeout=5)
        self.durability.close()  # after the scheduler: no snapshot may follow the final one
        if self.matchmaker is not None:
            self.matchmaker.write_view(self.clock(), final=True)
        self.runlog.close()
        self.episode_table.close()
        self.control.flush_batch_log()
        self.batch_log.close()
        self.storage.close()

    # -- membership and tasks (`Workers`) ---------------------------------------------------

    def register(self, req: RegisterRequest) -> RegisterResponse:
        return self.workers.register(req)

    def heartbeat(self, worker_id: str, req: HeartbeatRequest) -> HeartbeatResponse:
        return self.workers.heartbeat(worker_id, req)

    def leave(self, worker_id: str) -> Worker:
        return self.workers.leave(worker_id)

    def end_task(self, task_id: str, worker_id: str | None, error: str | None) -> TaskRecord:
        return self.workers.end_task(task_id, worker_id, error)

    def group_sync(self, req: GroupSyncRequest) -> GroupAssignment:
        return self.workers.group_sync(req)

    # -- the data plane (`DataPlane`, `Sampler`) --------------------------------------------

    def report_chunks(self, req: ChunkReport) -> ChunkReportResponse:
        return self.data.report_chunks(req)

    def collect_permit(self, req: CollectPermitRequest) -> CollectPermitResponse:
        return self.data.collect_permit(req)

    def sample(self, req: SampleRequest) -> SampleGrant:
        return self.sampler.sample(req)

    def learn_info(self, req: LearnInfo) -> LearnInfoResponse:
        return self.data.learn_info(req)

    def clear_buffer(self, name: str) -> BufferCleared:
        return self.data.clear_buffer(name)

    def load_buffer(self, name: str, req: BufferLoadRequest) -> BufferLoaded:
        return self.data.load_buffer(name, req)

    # -- run control (`RunControl`) ---------------------------------------------------------

    @property
    def stopped(self) -> bool:
        return self.state.stopped

    def stop(self, reason: str) -> None:
        self.control.stop(reason)

    def set_paused(self, paused: bool) -> RunState:
        return self.control.set_paused(paused)

    def scale(self, collectors: int | None, learners: int | None = None) -> RunState:
        return self.control.scale(collectors, learners)

    def run_state(self) -> RunState:
        return self.control.run_state()

    def report_evaluation(self, req: EvaluationReport) -> EvaluationResult:
        return self.control.report_evaluation(req)

    # -- reading state (`Readout`) ----------------------------------------------------------

    def rates(self) -> tuple[float, float]:
        return self.readout.rates()

    def status(self) -> Status:
        return self.readout.status()


__all__ = ["Coordinator", "RateLimited", "SampleGrant", "StaleGeneration", "UnknownBuffer",
           "UnknownTask", "UnknownWorker", "WrongWorker"]
