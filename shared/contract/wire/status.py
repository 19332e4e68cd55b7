"""`GET /status` (`Status`): the whole run at one glance, and the parts it is made of;
`GET /league` (`LeagueView`). `/status` is built as `Status` itself: the one definition
of that document.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlfleet.shared.contract.wire.base import Response
from rlfleet.shared.contract.wire.evaluation import EvaluationResult
from rlfleet.shared.contract.wire.membership import SlurmPlacement
from rlfleet.shared.contract.wire.views import BufferStats, TaskInfo, WorkerInfo


class RunInfo(Response):
    name: str
    state: Literal["running", "paused", "stopped"]
    paused: bool
    collectors_desired: int | None
    learners_desired: int | None = Field(None, description="set by `rlfleet scale --learners`")
    stop_reason: str | None
    solved: bool
    wall_seconds: float
    stop_value: float | None
    storage: str
    first_chunk_s: float | None = Field(description="seconds from start to the first chunk: "
                                        "the workers' start-up")
    slurm: SlurmPlacement | None = Field(None, description="the coordinator's own Slurm job "
                                         "and node; null: not under Slurm")


class RunCounters(Response):
    env_steps: int
    train_iterations: int
    granted_batches: int
    policy_version: int
    chunks_accepted: int
    episodes: int


class RunRates(Response):
    env_steps_per_s: float
    train_iterations_per_s: float


class ReplaySize(Response):
    size: int = Field(description="items in all buffers")
    chunks: int = Field(description="chunks some buffer refers to")


class CollectStats(Response):
    episode_return_mean: float | None
    episode_length_mean: float | None


class Ledger(Response):
    """Where every acknowledged chunk is: `acknowledged == in_buffers + evicted + consumed +
    sum(dropped)`, checked under the coordinator's lock (`balanced`)."""

    acknowledged: int = Field(description="chunks whose report the coordinator acknowledged")
    in_buffers: int = Field(description="chunks some buffer still holds (queued, in flight "
                            "or sampleable)")
    evicted: int = Field(description="pushed out of every buffer by newer data")
    consumed: int = Field(description="used up by a learner (queue buffers)")
    dropped: dict[str, int] = Field(description="let go of unused, by reason")
    balanced: bool
    duplicate_chunks: dict[str, int] = Field(description="per buffer, chunk ids indexed more "
                                             "than once (always 0)")
    orphans_deleted: int = Field(description="chunks written but never announced (their "
                                 "collector died), deleted from storage; never acknowledged")
    unannounced: int = Field(description="chunks in storage nobody announced yet, watched "
                             "for `coordinator.orphan_grace_s`")
    journal_generation: int = Field(description="the write-ahead journal being appended to")


class GroupRank(Response):
    rank: int
    worker_id: str
    updates_per_s: float = Field(description="train iterations per second this rank reported")
    allreduce_ms: float = Field(description="ms per train iteration in collectives")


class GroupReformation(Response):
    generation: int
    reason: str = Field(description="joined, left, died, registered again, collective "
                        "failed, scaled, store moved: then the worker and detail")
    world_size: int
    ranks: list[str]
    at_s: float = Field(description="seconds since the run started")


class LearnerGroupStatus(Response):
    """The data-parallel learner group: its generation and ranks, and how it got there."""

    generation: int
    world_size: int
    ranks: list[GroupRank]
    standby: list[str] = Field(description="learners beyond the size the batch splits among")
    learners_desired: int | None
    reformations: int
    reformations_by_reason: dict[str, int]
    last_reformation: GroupReformation | None
    history: list[GroupReformation] = Field(description="the last 10 re-formations")


class LeaguePlayer(Response):
    name: str
    kind: Literal["main", "snapshot", "bot"]
    policy_version: int | None
    mu: float
    sigma: float
    ordinal: float = Field(description="mu - 3 sigma, what players are ranked by")
    games: int = Field(description="rated games (self-play is not rated)")


class Payoff(Response):
    players: list[str]
    win: list[list[int]] = Field(description="win[i][j]: games players[i] won against "
                                 "players[j]")
    draw: list[list[int]]
    loss: list[list[int]]


class LeagueSummary(Response):
    """The self-play league's players, ratings and payoff matrix (`/status`'s `league`)."""

    games: int
    first_snapshot: str | None = Field(description="the league's first snapshot, which "
                                       "'snapshot-first' in `stop_when` names (null: none "
                                       "yet)")
    players: list[LeaguePlayer] = Field(description="best ordinal first")
    probabilities: dict[str, float] = Field(description="chance the main player meets each "
                                            "opponent next ('main': self-play)")
    payoff: Payoff


class LeagueView(LeagueSummary):
    """`GET /league`: the self-play league with each player's rating history."""

    ratings: dict[str, list[tuple[int, float, float]]] = Field(
        default_factory=dict, description="per player, (league game, mu, sigma) points")


class Alert(Response):
    """Something the run's user must be told although every request succeeds."""

    kind: Literal["nonfinite_metrics", "data_shortage"]
    message: str
    worker_id: str | None = None
    train_iteration: int | None = Field(None, description="nonfinite_metrics: where the "
                                        "first such value was reported")
    metrics: dict[str, int] = Field(default_factory=dict, description="nonfinite_metrics: "
                                    "values dropped per metric")
    waited_s: float | None = Field(None, description="data_shortage: seconds the learner has "
                                   "waited for data")


class Status(Response):
    """`GET /status`: the whole run at one glance (`rlfleet status` prints it)."""

    run: RunInfo
    counters: RunCounters
    rates: RunRates
    buffer: ReplaySize
    buffers: dict[str, BufferStats]
    metrics: dict[str, int | float] = Field(description="flat scalars under the names the "
                                            "logger uses (`buffer/...`, `collect/...`, "
                                            "`train/...`, `eval/...`)")
    collect: CollectStats
    train: dict[str, float] = Field(description="the learner's last reported metrics")
    workers: list[WorkerInfo]
    tasks: list[TaskInfo] = Field(description="active tasks only")
    latest_evaluation: EvaluationResult | None
    best_evaluation: EvaluationResult | None
    ledger: Ledger
    learner_group: LearnerGroupStatus
    league: LeagueSummary | None = Field(None, description="self-play runs: the league "
                                         "(without rating histories)")
    alerts: list[Alert] = Field(default_factory=list, description="what went wrong quietly: "
                                "a learner's metrics went NaN, a learner starved of data")
