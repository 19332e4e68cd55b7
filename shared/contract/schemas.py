"""Wire schemas of the control plane: every JSON body any role sends or answers.

Requests forbid unknown fields, so a misspelt field is a 400 that names it rather than a
silently ignored value. Payload data never appears here: chunks travel through storage and
only their metadata (`ChunkMeta`) crosses HTTP.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    ValidationInfo,
    field_validator,
    model_validator,
)

API = "/api/v1"

Id = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")]
# Counters, versions and lengths end up in the replay's numpy int64 arrays and in arithmetic
# on them, and in JavaScript clients: bounded to the integers a double holds exactly, far
# from int64's limit (beyond it numpy raises OverflowError: a 500, not a 400).
MAX_COUNT = 2**53 - 1
Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]
Version = Annotated[int, Field(ge=-1, le=MAX_COUNT, description="-1: before any published "
                                                                "version")]
Int64 = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]
# Returns are averaged, and squared for a std, over up to 100,000 episodes: bounded so those
# sums stay finite (an infinite mean would make the answer invalid JSON, or null).
MAX_RETURN = 1e100
Return = Annotated[float, Field(ge=-MAX_RETURN, le=MAX_RETURN, allow_inf_nan=False)]
# Values the coordinator keeps and answers again (GET /workers, /status) or logs: JSON has no
# inf or NaN, but `1e400` parses as inf (and pydantic takes `NaN`); kept, one would come back
# out as `Infinity`, which is not JSON.
Finite = Annotated[float, Field(allow_inf_nan=False)]
# A share of episodes; None where it was not measured (an env that reports no success).
SuccessRate = Annotated[float | None, Field(ge=0.0, le=1.0, allow_inf_nan=False)]
# Env settings a task carries (`coordinator.commander`): a few JSON scalars by keyword, and
# the seeds of the levels the envs replay.
JsonScalar = Annotated[str, Field(max_length=1024)] | bool | Int64 | Finite | None
EnvKwargs = Annotated[dict[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")],
                           JsonScalar], Field(max_length=64)]
LevelSeeds = Annotated[list[Annotated[int, Field(ge=0, le=2**32 - 1)]] | None,
                       Field(min_length=1, max_length=10_000)]


# `defer_build`: a model's validator is built when it is first used, not when this module is
# imported: building all of them would add to every role's start-up, and a role uses few.
class Request(BaseModel):
    model_config = ConfigDict(extra="forbid", defer_build=True)


class Response(BaseModel):
    model_config = ConfigDict(extra="ignore", defer_build=True)


class Role(StrEnum):
    COLLECTOR = "collector"
    LEARNER = "learner"


class WorkerState(StrEnum):
    ALIVE = "alive"
    DEAD = "dead"
    LEFT = "left"


class TaskKind(StrEnum):
    COLLECT = "collect"
    LEARN = "learn"
    EVALUATE = "evaluate"


class TaskState(StrEnum):
    PENDING = "pending"      # created, not yet accepted by its worker
    RUNNING = "running"
    UNASSIGNED = "unassigned"  # its worker died: waiting for another worker of its role
    FINISHED = "finished"
    FAILED = "failed"


# -- membership ---------------------------------------------------------------------------

class GpuInfo(Request):
    """One GPU a worker can use, as torch numbers it (after `CUDA_VISIBLE_DEVICES`)."""

    index: int = Field(ge=0, le=1023, description="the device's number: `cuda:<index>`")
    name: str = Field(min_length=1, max_length=256, description="e.g. 'NVIDIA H100 80GB HBM3'")
    memory_bytes: Count = Field(description="the device's total memory")


class SlurmPlacement(Request):
    """Where Slurm runs a worker: its job and node, from the job's environment
    (`SLURM_JOB_ID`, `SLURMD_NODENAME`, `SLURM_RESTART_COUNT`)."""

    job_id: str = Field(min_length=1, max_length=64, pattern=r"^[0-9]+([_+][0-9]+)?$",
                        description="the Slurm job id (an array or het job's `N_M`, `N+M`)")
    node: str = Field(min_length=1, max_length=253, description="the node Slurm chose")
    restart_count: int = Field(0, ge=0, le=1_000_000, description="times the job was "
                               "requeued before this run of it")


class WorkerResources(Request):
    """What a worker has, as it reports it when it registers (`shared/infra/resources.py`)."""

    hostname: str = Field(min_length=1, max_length=253, description="the machine's name")
    cpu_cores: int = Field(ge=1, le=1_000_000, description="the cores this process may run "
                           "on (its CPU affinity), not all the machine's")
    memory_bytes: Count = Field(description="the machine's total memory")
    gpus: list[GpuInfo] = Field(default_factory=list, max_length=1024,
                                description="the GPUs this process can use; empty: none")
    slurm: SlurmPlacement | None = Field(None, description="the Slurm job and node the "
                                         "worker runs in; null: not under Slurm")


class RegisterRequest(Request):
    role: Role
    url: str = Field(min_length=1, max_length=512, pattern=r"^https?://",
                     description="where the coordinator reaches this worker's HTTP service")
    worker_id: Id | None = Field(None, description="a stable id; registering again under it "
                                 "from the same URL (a restart) replaces the old entry; from "
                                 "another URL while the holder still heartbeats and answers "
                                 "there, 409")
    resources: WorkerResources | None = Field(None, description="what the worker has; a "
                                              "config asking for CUDA (`learner.device`, "
                                              "`collector.device`) refuses a worker that "
                                              "reports no such GPU (409). Absent: not checked")


class RegisterResponse(Response):
    worker_id: str
    run_name: str
    storage: str
    config: dict[str, Any]
    heartbeat_interval_s: float
    # The run's env steps so far: a collector (re)started mid-run explores from there, not
    # from the schedule's start (nor at random as at the run's start).
    env_steps: int = Field(default=0, ge=0)


class HeartbeatRequest(Request):
    status: dict[str, Finite] = Field(default_factory=dict, max_length=64)
    url: str | None = Field(None, min_length=1, max_length=512, pattern=r"^https?://",
                            description="the URL this worker registered with: a 409 says "
                            "another process holds its id now. Absent: not checked")


class HeartbeatResponse(Response):
    stop: bool
    paused: bool = False
    policy_version: int | None
    env_steps: int
    group_generation: int | None = Field(None, description="learners: the learner group's "
                                         "current generation; a learner in an older one "
                                         "re-forms")


# -- the learner group (learner <-> coordinator) ----------------------------------------------

StoreAddr = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:\[\]-]{1,250}:[0-9]{1,5}$",
                                 description="host:port of a torch.distributed TCPStore")]


class GroupSyncRequest(Request):
    """A learner asks which generation of the learner group it is in. Sent when it starts,
    when it sees a newer generation, and when a collective of its generation failed."""

    worker_id: Id
    store_addr: StoreAddr = Field(description="the TCPStore this learner hosts (used when it "
                                  "is rank 0)")
    generation: int | None = Field(None, ge=0, le=MAX_COUNT, description="the generation the "
                                   "learner is in (null: none yet)")
    broken: str | None = Field(None, max_length=2048, description="why a collective or the "
                               "rendezvous of `generation` failed: the group must re-form")


class GroupAssignment(Response):
    """One learner's place in the current generation of the learner group."""

    generation: int
    epoch: str = Field(description="the coordinator process's id: with the generation, names "
                       "the rendezvous (a restarted coordinator counts generations anew)")
    rank: int | None = Field(description="null: standby (the group is full for this config)")
    world_size: int
    store_addr: str | None = Field(description="rank 0's TCPStore, where the ranks meet")
    ranks: list[str] = Field(description="worker ids by rank")
    publisher: bool = Field(description="this rank publishes policy versions and checkpoints")


# -- tasks (coordinator -> worker, POST /task) ----------------------------------------------

# A league player's name: 'main', 'snapshot-<version>', 'bot-<bot>' (a user's bot is named by
# its import path, hence the colon).
PlayerName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,255}$")]


class Opponent(Request):
    """Whom the learning side of a battle collector meets in one game: a league player.
    `main` is the learning policy itself (self-play), a snapshot a frozen policy version
    in storage, a bot a fixed player named by `bot`."""

    name: PlayerName = Field(description="the league player: 'main', 'snapshot-<version>', "
                     "'bot-<bot>'")
    kind: Literal["main", "snapshot", "bot"]
    policy_version: Version | None = Field(None, description="a snapshot's frozen version")
    bot: str | None = Field(None, max_length=256, description="a bot: 'random', 'perfect' "
                            "or 'package.module:make_bot'")

    @model_validator(mode="after")
    def _complete(self) -> Opponent:
        if self.kind == "snapshot" and (self.policy_version is None
                                        or self.policy_version < 0):
            raise ValueError("policy_version: a snapshot opponent needs its version (>= 0)")
        if self.kind == "bot" and not self.bot:
            raise ValueError("bot: a bot opponent needs the bot's name")
        return self


class GameRecord(Request):
    """One finished game of a battle collector, from the learning side's point of view."""

    opponent: PlayerName = Field(description="the league player it met")
    policy_version: Version = Field(description="the learning side's policy version (the "
                                    "oldest that moved in the game)")
    opponent_version: Version | None = Field(description="the opponent's policy version "
                                             "(null for a bot)")
    first: bool = Field(description="the learning side moved first")
    outcome: Literal["win", "draw", "loss"]
    plies: Count = Field(description="moves by both sides")


class CollectTask(Request):
    kind: Literal[TaskKind.COLLECT] = TaskKind.COLLECT
    task_id: Id
    seed: int
    mode: Literal["samples", "episodes"] = Field("samples", description="cut chunks by "
                                                 "transitions or by whole episodes")
    chunk_size: int = Field(256, ge=1, le=1_000_000, description="samples mode: transitions "
                            "per chunk")
    episodes_per_chunk: int = Field(4, ge=1, le=10_000, description="episodes mode: whole "
                                    "episodes per chunk")
    opponents: list[Opponent] = Field(default_factory=list, max_length=1024, description=(
        "self-play: whom the next games meet, in order (then each chunk report's answer "
        "brings more)"))
    apex_slot: int | None = Field(None, ge=0, description="Ape-X (`collector.epsilon_schedule: "
                                  "apex`): the collector's slot i of `collector.apex_slots`, "
                                  "the lowest free one when the task was handed out; null: "
                                  "the algorithm's own epsilon schedule")
    epsilon: float | None = Field(None, ge=0, le=1, description="Ape-X: the slot's fixed "
                                  "epsilon, which the collector acts with for as long as it "
                                  "runs; null: the algorithm's own schedule")
    # -- env settings from the run's commander (`coordinator.commander`) --
    env_kwargs: EnvKwargs = Field(default_factory=dict, description=(
        "keyword arguments for the env on top of `env.kwargs`; the coordinator pushes the "
        "task again when its commander changes them, and the collector rebuilds its envs"))
    level_seeds: LevelSeeds = Field(None, description=(
        "env i resets with seed `level_seeds[i % len]` at every episode (a level of a "
        "procedurally generated env); null: the envs' own seeding"))


class LearnTask(Request):
    kind: Literal[TaskKind.LEARN] = TaskKind.LEARN
    task_id: Id
    seed: int


class EvaluateTask(Request):
    kind: Literal[TaskKind.EVALUATE] = TaskKind.EVALUATE
    task_id: Id
    policy_version: int = Field(ge=0)
    episodes: int = Field(ge=1, le=10_000)
    num_envs: int = Field(ge=1, le=10_000)
    seed: int
    stochastic: bool = Field(True, description="after the deterministic episodes, run as many "
                             "with the exploring policy")
    battles: list[Opponent] = Field(default_factory=list, max_length=64, description=(
        "self-play: play `episodes` games against each of these as first player and as "
        "many as second, instead of episodes"))
    video: bool = Field(False, description="also record a video of the policy (`eval.video`) "
                        "to storage as `video-<task id>`")
    env_kwargs: EnvKwargs = Field(default_factory=dict, description=(
        "keyword arguments for the env on top of `env.kwargs` (the commander's "
        "`evaluate_settings`: the level under evaluation)"))


Task = Annotated[CollectTask | LearnTask | EvaluateTask, Field(discriminator="kind")]


class TaskEnvelope(Request):
    """The body of `POST /task` on a worker."""

    task: Task


class TaskAccepted(Response):
    task_id: str
    accepted: bool


# -- experience (collector -> coordinator) --------------------------------------------------

class ChunkMeta(Request):
    chunk_id: Id
    length: int = Field(ge=1, le=10_000_000, description="transitions in the chunk")
    policy_version: Version = Field(description="-1: acted before any published version")
    episode_returns: list[Return] = Field(default_factory=list, max_length=100_000)
    episode_lengths: list[Count] = Field(default_factory=list, max_length=100_000)
    segments: list[tuple[int, int]] = Field(
        default_factory=list, max_length=100_000, description="(start row, length) runs of "
        "rows from one episode, in time order; empty means the whole chunk is one run")
    timers: dict[str, Finite] = Field(default_factory=dict, max_length=16, description="ms per "
                                     "vector step (env_step, inference) or per chunk (write)")
    episode_return_components: list[list[Return]] = Field(
        default_factory=list, max_length=100_000, description="vector-reward envs: each "
        "finished episode's return per reward component (before scalarising)")
    games: list[GameRecord] = Field(default_factory=list, max_length=100_000, description=(
        "self-play: the games that ended in this chunk, both sides' versions and outcome"))
    opponents_skipped: list[PlayerName] = Field(default_factory=list, max_length=1024, description=(
        "self-play: assigned opponents the collector could not load (their games were "
        "played against the learning policy itself)"))
    episode_envs: list[Count] = Field(default_factory=list, max_length=100_000, description=(
        "the index in the collector's vector env of each finished episode (the episode "
        "table's `env_index`)"))

    @model_validator(mode="after")
    def _consistent(self) -> ChunkMeta:
        if len(self.episode_returns) != len(self.episode_lengths):
            raise ValueError(f"episode_returns has {len(self.episode_returns)} entries but "
                             f"episode_lengths has {len(self.episode_lengths)}")
        covered = 0
        for start, n in sorted(self.segments):
            if start != covered or n < 1:
                raise ValueError(f"segments must tile rows 0..{self.length - 1} without gaps "
                                 f"or overlaps; found ({start}, {n}) after row {covered - 1}")
            covered += n
        if self.segments and covered != self.length:
            raise ValueError(f"segments cover {covered} rows but the chunk has {self.length}")
        if self.episode_envs and len(self.episode_envs) != len(self.episode_returns):
            raise ValueError(f"episode_envs has {len(self.episode_envs)} entries but "
                             f"episode_returns has {len(self.episode_returns)}")
        if self.episode_return_components and \
                len(self.episode_return_components) != len(self.episode_returns):
            raise ValueError(f"episode_return_components has "
                             f"{len(self.episode_return_components)} entries but "
                             f"episode_returns has {len(self.episode_returns)}")
        return self


class ChunkReport(Request):
    worker_id: Id
    task_id: Id
    chunks: list[ChunkMeta] = Field(min_length=1, max_length=10_000)


class ChunkReportResponse(Response):
    accepted: int
    env_steps: int
    throttle_s: float = Field(description="how long the collector should wait before "
                              "producing more: the replay ratio says the learner is behind")
    stop: bool
    opponents: list[Opponent] = Field(default_factory=list, description="self-play: whom the "
                                      "next games meet (one per game reported)")


# -- sampling and learning (learner <-> coordinator) ----------------------------------------

class MixShare(Request):
    buffer: Id
    fraction: float = Field(gt=0, le=1)


# Items (batch rows) one sample request may ask for, all batches together: an answer holds
# three int64 arrays per item (and their JSON lists), so one request cannot take the
# coordinator's memory (1024 x 65,536 items would be 1.6 GB of arrays alone).
MAX_SAMPLE_ITEMS = 262_144


def sample_items(batch_size: int, num_batches: int, by_buffer: dict[str, int] | None) -> int:
    """The items a request asks for: its batches times their size (by_buffer: their sum)."""
    per_batch = sum(by_buffer.values()) if by_buffer else batch_size
    return per_batch * num_batches


class SampleRequest(Request):
    worker_id: Id
    batch_size: int = Field(ge=1, le=65_536, description="items per batch (with `mix`)")
    num_batches: int = Field(ge=1, le=1024)
    wait_s: float = Field(0.0, ge=0, le=30, description="how long to wait for the buffer or "
                          "the rate limiter before answering 429")
    mix: list[MixShare] | None = Field(None, min_length=1, max_length=16, description="draw "
                                       "each batch from these buffers in these fractions")
    # The size bound is on the values' type, so the OpenAPI document states it too.
    by_buffer: dict[str, Annotated[int, Field(ge=1, le=65_536)]] | None = Field(
        None, min_length=1, max_length=16, description="or: one batch per buffer, of this size")
    group_generation: int | None = Field(None, ge=0, le=MAX_COUNT, description="a learner in "
                                         "a group of several: its generation; the answer is "
                                         "this rank's shard of the group's batches")
    group_cursor: int | None = Field(None, ge=0, le=MAX_COUNT, description="with "
                                     "group_generation: the sequence number of the first "
                                     "group batch (or rollout) wanted; earlier ones are done")

    @field_validator("num_batches")
    @classmethod
    def _items_capped(cls, num_batches: int, info: ValidationInfo) -> int:
        batch_size = info.data.get("batch_size")
        if batch_size is not None and batch_size * num_batches > MAX_SAMPLE_ITEMS:
            raise ValueError(f"{num_batches} batches of {batch_size} items is "
                             f"{batch_size * num_batches} items; one request may ask for at "
                             f"most {MAX_SAMPLE_ITEMS}")
        return num_batches

    @field_validator("by_buffer")
    @classmethod
    def _buffer_items_capped(cls, by_buffer: dict[str, int] | None,
                             info: ValidationInfo) -> dict[str, int] | None:
        num_batches = info.data.get("num_batches")
        if by_buffer and num_batches is not None and \
                sample_items(0, num_batches, by_buffer) > MAX_SAMPLE_ITEMS:
            raise ValueError(f"{num_batches} x {sum(by_buffer.values())} items is more than "
                             f"one request may ask for ({MAX_SAMPLE_ITEMS})")
        return by_buffer

    @model_validator(mode="after")
    def _one_mode(self) -> SampleRequest:
        if (self.group_generation is None) != (self.group_cursor is None):
            raise ValueError("give group_generation and group_cursor together")
        if self.mix is not None and self.by_buffer is not None:
            raise ValueError("give either mix or by_buffer, not both")
        if self.mix is not None:
            total = sum(m.fraction for m in self.mix)
            if abs(total - 1.0) > 1e-6:
                raise ValueError(f"mix fractions sum to {total}, not 1")
        return self


class SamplePart(Response):
    """The items one buffer contributed: batch b, item i is row `rows[b][i]` (the first row
    of a sequence when `sequence_length` is set; a whole chunk when `lengths` is set) of
    chunk `chunk_ids[chunk_index[b][i]]` of the response."""

    buffer: str
    key: str | None = Field(None, description="by_buffer mode: the batch this part is")
    chunk_index: list[list[int]]
    rows: list[list[int]]
    item_ids: list[list[int]]
    weights: list[list[float]] | None = None
    sequence_length: int | None = None
    lengths: list[int] | None = None


class SampleResponse(Response):
    chunk_ids: list[str]
    parts: list[SamplePart]
    num_batches: int
    env_steps: int
    train_iterations: int = 0
    policy_version: int = -1
    stop: bool = False
    group_generation: int | None = Field(None, description="the learner group's generation")
    first_seq: int | None = Field(None, description="group shards: the sequence number of "
                                  "the first batch (or rollout) in this answer")


class PriorityUpdate(Request):
    buffer: Id
    item_ids: list[Int64] = Field(max_length=1_000_000)
    priorities: list[float] = Field(max_length=1_000_000)

    @model_validator(mode="after")
    def _same_length(self) -> PriorityUpdate:
        if len(self.item_ids) != len(self.priorities):
            raise ValueError(f"{len(self.item_ids)} item_ids but {len(self.priorities)} "
                             "priorities")
        return self


class Consumed(Request):
    buffer: Id
    chunk_ids: list[Id] = Field(max_length=100_000)


class HistogramData(Request):
    """One histogram, as TensorBoard keeps one: each bucket's right edge and count."""

    min: Finite
    max: Finite
    num: Finite = Field(ge=0)
    sum: Finite
    sum_squares: Finite
    bucket_limits: list[Finite] = Field(min_length=1, max_length=256)
    bucket_counts: list[Finite] = Field(min_length=1, max_length=256)

    @model_validator(mode="after")
    def _same_length(self) -> HistogramData:
        if len(self.bucket_limits) != len(self.bucket_counts):
            raise ValueError(f"bucket_limits has {len(self.bucket_limits)} entries but "
                             f"bucket_counts has {len(self.bucket_counts)}")
        return self


MAX_LOGGED_SAMPLES = 65_536  # per report: logging.batch_log's rows, all entries together
MAX_LOGGED_ENTRIES = 1024  # per report: logged updates x buffers
MAX_SAMPLE_VALUES = 32  # per entry: value names
SAMPLE_VALUE_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$"
SampleValueName = Annotated[str, Field(pattern=SAMPLE_VALUE_PATTERN)]


class BatchLogEntry(Request):
    """`logging.batch_log`: one logged update's samples from one buffer, with the
    per-sample values the policy and the hooks gave for them (`null`: not finite)."""

    train_iteration: Count
    buffer: Id
    item_ids: list[Int64] = Field(min_length=1, max_length=MAX_LOGGED_SAMPLES)
    values: dict[SampleValueName, list[Finite | None]] = Field(default_factory=dict,
                                                              max_length=MAX_SAMPLE_VALUES)

    @model_validator(mode="after")
    def _same_length(self) -> BatchLogEntry:
        for name, column in self.values.items():
            if len(column) != len(self.item_ids):
                raise ValueError(f"values.{name} has {len(column)} entries but item_ids "
                                 f"has {len(self.item_ids)}")
        return self


class LearnInfo(Request):
    worker_id: Id
    train_iterations: Count
    policy_version: Version
    metrics: dict[str, Finite] = Field(default_factory=dict, max_length=256, description=
                                       "each metric's mean over the updates since the last "
                                       "report (its finite values)")
    metric_counts: dict[str, Count] = Field(default_factory=dict, max_length=256, description=
                                            "how many values each mean is of (absent: 1), "
                                            "to weight reports into a logging interval")
    metrics_min: dict[str, Finite] = Field(default_factory=dict, max_length=256)
    metrics_max: dict[str, Finite] = Field(default_factory=dict, max_length=256)
    arrays: dict[str, Annotated[list[Finite], Field(max_length=4096)]] = Field(
        default_factory=dict, max_length=16, description="array metrics (a value per action, "
        "say): the last one of the interval, finite elements only")
    nonfinite: dict[str, Count] = Field(default_factory=dict, max_length=256, description=
                                        "NaN or infinite values dropped per metric since the "
                                        "last report")
    histograms: dict[str, HistogramData] = Field(default_factory=dict, max_length=64,
                                                 description="logging.histograms, when taken "
                                                 "since the last report")
    priorities: list[PriorityUpdate] = Field(default_factory=list, max_length=64)
    consumed: list[Consumed] = Field(default_factory=list, max_length=64)
    timers: dict[str, Finite] = Field(default_factory=dict, max_length=32, description="ms per "
                                     "train iteration since the last report, by phase")
    dataset_eval: dict[str, Finite] = Field(default_factory=dict, max_length=8, description=
                                            "the metric evaluator's scores (eval.dataset), when "
                                            "one ran since the last report")
    batch_log: list[BatchLogEntry] = Field(default_factory=list, max_length=MAX_LOGGED_ENTRIES,
                                           description="logging.batch_log: the samples of "
                                           "the updates logged since the last report")

    @model_validator(mode="after")
    def _bounded_batch_log(self) -> LearnInfo:
        rows = sum(len(e.item_ids) for e in self.batch_log)
        if rows > MAX_LOGGED_SAMPLES:
            raise ValueError(f"batch_log holds {rows} samples; at most {MAX_LOGGED_SAMPLES} "
                             "go in one report")
        return self


class LearnInfoResponse(Response):
    stop: bool
    best_policy_version: int | None = Field(None, description="the best-evaluated policy "
                                            "version so far: its checkpoint is kept")


# -- evaluation (collector -> coordinator) ---------------------------------------------------

EvalMode = Literal["deterministic", "stochastic"]


def success_rate(successes: list[bool | None] | None) -> float | None:
    """The share of episodes that reached their goal, over those whose env said; None when
    none did (an env without `info["is_success"]`): "not measured" is not "never"."""
    known = [bool(s) for s in successes or () if s is not None]
    return sum(known) / len(known) if known else None


class EvalEpisodes(Request):
    returns: list[Return] = Field(min_length=1, max_length=100_000)
    lengths: list[Count] = Field(min_length=1, max_length=100_000)
    successes: list[StrictBool | None] | None = Field(None, max_length=100_000, description=(
        "goal-conditioned envs: whether each episode ended in success (its last step's "
        "`info['is_success']`; null where the env did not say); absent when the env reports "
        "no success at all"))
    truncated: list[StrictBool] | None = Field(None, max_length=100_000, description=(
        "whether each episode was cut short instead of terminating: by the env's time limit "
        "or at `eval.max_steps`; absent where the evaluation does not say (self-play games "
        "always end)"))
    info: dict[str, list[Finite | None]] = Field(default_factory=dict, max_length=32,
                                                description="`eval.info_keys`: each episode's "
                                                "value at its last step (null where its env "
                                                "reported none)")

    @model_validator(mode="after")
    def _same_length(self) -> EvalEpisodes:
        if len(self.returns) != len(self.lengths):
            raise ValueError(f"returns has {len(self.returns)} entries but lengths has "
                             f"{len(self.lengths)}")
        for name in ("successes", "truncated"):
            flags = getattr(self, name)
            if flags is not None and len(flags) != len(self.returns):
                raise ValueError(f"{name} has {len(flags)} entries but returns has "
                                 f"{len(self.returns)}")
        for key, values in self.info.items():
            if len(values) != len(self.returns):
                raise ValueError(f"info[{key!r}] has {len(values)} entries but returns has "
                                 f"{len(self.returns)}")
        return self

    @property
    def success_rate(self) -> float | None:
        return success_rate(self.successes)


class BattleOutcome(Request):
    """Evaluation games against one league player from one seat."""

    opponent: PlayerName
    first: bool = Field(description="the evaluated policy moved first")
    win: Count
    draw: Count
    loss: Count


class VideoReport(Request):
    frames: int = Field(ge=1, le=1_000_000)
    fps: int = Field(ge=1, le=240)
    episodes: int = Field(ge=1, le=10)
    returns: list[Return] = Field(max_length=10, description="each recorded episode's return")


class EvaluationReport(Request):
    """Episodes of one evaluation task: `deterministic` always, `stochastic` when asked. A
    self-play run's evaluation plays games (`battles`); its `deterministic` episodes are
    those games, each returning +1, 0 or -1."""

    worker_id: Id
    task_id: Id
    policy_version: Version
    deterministic: EvalEpisodes
    stochastic: EvalEpisodes | None = None
    battles: list[BattleOutcome] = Field(default_factory=list, max_length=1024)
    video: VideoReport | None = Field(None, description="the video asked for, stored as "
                                      "`video-<task id>` (MP4) and `video-gif-<task id>`")


class EvalSummary(Response):
    episodes: int
    return_mean: float
    return_std: float
    return_min: float
    return_max: float
    length_mean: float
    success_rate: SuccessRate = None
    truncated: int | None = Field(None, description=(
        "episodes cut short instead of terminating (the env's time limit or `eval.max_steps`),"
        " logged as eval/<mode>/truncated; null where the report did not say"))
    info: dict[str, float] = Field(default_factory=dict, description="`eval.info_keys`: each "
                                   "key's mean over the episodes whose env reported it "
                                   "(logged as eval/<mode>/info/<key>)")


class EvaluationResult(Response):
    """`return_mean`/`return_std`/`length_mean` repeat the deterministic figures: they are
    what the stop value is compared with."""

    task_id: str
    worker_id: str
    policy_version: int
    env_steps: int
    train_iterations: int
    episodes: int
    return_mean: float
    return_std: float
    length_mean: float
    wall_time: float
    success_rate: SuccessRate = Field(None, description=(
        "goal-conditioned envs: the share of deterministic episodes that reached their goal "
        "(`info['is_success']` at their last step); null for envs that report no success"))
    deterministic: EvalSummary | None = None
    stochastic: EvalSummary | None = None
    battles: dict[str, dict[str, float]] = Field(
        default_factory=dict, description="self-play: rates ('win', 'draw', 'loss') and "
        "'games' by opponent ('bot-random'), and by seat ('bot-random/first')")
    seq: int = Field(0, description="the evaluation's number in the run, from 1: the cursor "
                     "of `GET /evaluations?since=`")
    video: str | None = Field(None, description="the evaluation's video, relative to the run "
                              "directory (`videos/...mp4`)")


class TaskResult(Request):
    """A worker telling the coordinator a task ended (`POST /tasks/<id>/finish|fail`)."""

    worker_id: Id | None = None
    error: str | None = Field(None, max_length=4096)


class ErrorBody(Response):
    """Every error answer of every service (`rlfleet.shared.infra.webapp.error`)."""

    error: str
    field: str | None = Field(None, description="the dotted path of the offending field "
                              "(or header: `Authorization`), when there is one")
    detail: list[dict[str, Any]] | None = Field(None, description="400: every validation "
                                                "error, as pydantic reports them")
    retry_after_s: float | None = Field(None, description="429: the `Retry-After` header's "
                                        "value, in seconds")
    holder_url: str | None = Field(None, description="409 about a `worker_id`: the URL of "
                                   "the live worker that holds it")


class CollectPermitRequest(Request):
    """Asked by a collector the coordinator told to throttle: wait until collecting may go on."""

    worker_id: Id
    wait_s: float = Field(1.0, ge=0, le=30)


class CollectPermitResponse(Response):
    granted: bool
    stop: bool


# -- run control (operator -> coordinator) ---------------------------------------------------

class ScaleRequest(Request):
    """How many collectors the run should have. The coordinator records it; whatever starts
    processes (`rlfleet up`'s launcher; compose or Kubernetes act on their own scale
    commands) reconciles, draining the collectors it removes."""

    collectors: int | None = Field(None, ge=0, le=1024, description="at least one of "
                                   "collectors and learners is needed")
    learners: int | None = Field(None, ge=1, le=1024, description="learners in the learner "
                                 "group; the config must be able to split its batch among "
                                 "them")


class RunState(Response):
    state: Literal["running", "paused", "stopped"]
    paused: bool
    stop_reason: str | None = None
    collectors_desired: int | None = None
    collectors_alive: int
    learners_desired: int | None = None
    learners_alive: int = 0


# -- read-only views (coordinator GET routes) ------------------------------------------------
# What the coordinator's GET routes answer. The coordinator builds most of these as plain dicts
# (they mirror its internal records); these models describe them for the OpenAPI document, so
# a client, or schemathesis, can check an answer without reading the coordinator's code.
# `/status` is built as `Status` itself: the one definition of that document.


class Health(Response):
    ok: bool
    role: str


class WorkerInfo(Response):
    """One member of the cluster, as `rlfleet.coordinator.membership.Worker.to_json` reports it."""

    worker_id: str
    role: Role
    url: str
    state: WorkerState
    registrations: int = Field(description="1, plus one per registration again under this id")
    seconds_since_heartbeat: float
    chunks_accepted: int = Field(description="chunks this worker reported that were taken")
    status: dict[str, float] = Field(description="the worker's last heartbeat `status`")
    resources: WorkerResources | None = Field(None, description="what the worker reported "
                                              "having when it last registered; null: it "
                                              "reported nothing")


class WorkerList(Response):
    workers: list[WorkerInfo]


class TaskInfo(Response):
    """One task, as `rlfleet.coordinator.tasks.TaskRecord.to_json` reports it."""

    task_id: str
    kind: TaskKind
    worker_id: str
    state: TaskState
    error: str | None
    reassignments: int = Field(0, description="times the task was handed out again: to "
                               "its worker restarted, or to another after its worker died")
    task: Task


class TaskList(Response):
    tasks: list[TaskInfo]


class BufferStats(Response):
    """One replay buffer: its kind, and numeric statistics whose names depend on the kind
    (`size`, `capacity`, `inserted_items`, ..., `dropped/<reason>`)."""

    model_config = ConfigDict(extra="allow")
    __pydantic_extra__: dict[str, float]

    kind: str


class BufferList(Response):
    buffers: dict[str, BufferStats]


class BufferInfo(BufferStats):
    """`GET /buffers/<name>`: the buffer's statistics and its name."""

    name: str


class BufferChunks(Response):
    """`GET /buffers/<name>/chunks`: the chunk ids a buffer indexes, once per index entry
    (so a chunk indexed twice would show twice; none ever is)."""

    name: str
    chunk_ids: list[str]


class BufferClearRequest(Request):
    """`POST /buffers/<name>/clear`: no fields (an empty object, or no body)."""


class BufferCleared(Response):
    """What a clear let go of: the buffer's items, and the chunks it referred to (those no
    other buffer holds are deleted from storage as evicted chunks are)."""

    name: str
    items: int = Field(description="items the buffer held (a queue: its queued items; the "
                       "chunks learners hold are released too)")
    chunks: int = Field(description="chunks the buffer referred to")


class BufferLoadRequest(Request):
    """`POST /buffers/<name>/load`: chunks already written to the run's storage (as a
    collector writes them), indexed in this one buffer (`rlfleet buffer load`)."""

    chunks: list[ChunkMeta] = Field(min_length=1, max_length=10_000)
    priorities: list[list[Finite]] | None = Field(
        None, max_length=10_000, description="prioritized buffers: one priority per row of "
        "each chunk, in the order of `chunks`; absent: new items' usual (the largest seen)")


class BufferLoaded(Response):
    name: str
    accepted: int = Field(description="chunks indexed (a chunk already held counts once)")
    items: int = Field(description="the buffer's items after the load")


MAX_EVALUATIONS_PER_PAGE = 1000


class EvaluationsQuery(Request):
    """`GET /evaluations` query: the evaluations after a cursor."""

    since: Count = Field(0, description="the `next` of the previous answer (an evaluation's "
                         "`seq`); 0: from the oldest evaluation kept")
    limit: int = Field(100, ge=1, le=MAX_EVALUATIONS_PER_PAGE,
                       description="at most this many evaluations per answer")


class EvaluationList(Response):
    """`GET /evaluations`: a page of the run's evaluations, oldest first. The coordinator
    keeps the newest ones in memory (`EVALUATION_WINDOW`); the whole history is in the run's
    `metrics.jsonl` (scope `eval`)."""

    evaluations: list[EvaluationResult]
    total: int = Field(description="evaluations reported in the whole run")
    next: int = Field(description="the cursor to pass as `since` next time")
    missed: int = Field(description="evaluations after the cursor that are no longer kept")
    more: bool = Field(description="more evaluations are waiting: ask again at once")


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


# -- the run's log records, as a feed (the dashboard's curves) --------------------------------

MAX_RECORDS_PER_PAGE = 5000


class RecordsQuery(Request):
    """`GET /records` query: the records after a cursor, of some scopes."""

    after: Count = Field(0, description="the `next` of the previous answer; 0: from the "
                         "oldest record kept")
    # The scopes of rlfleet.shared.contract.config.SCOPES (a unit test holds the two together).
    scope: str | None = Field(None, pattern=r"^(train|collect|eval|update|info)"
                              r"(,(train|collect|eval|update|info))*$",
                              description="comma-separated scopes; all when absent")
    limit: int = Field(1000, ge=1, le=MAX_RECORDS_PER_PAGE,
                       description="at most this many records per answer")

    def scopes(self) -> list[str] | None:
        return self.scope.split(",") if self.scope else None


class LogRecord(Response):
    seq: int = Field(description="the record's position in this coordinator's feed")
    scope: str
    step: int = Field(description="the run's env step (train iterations for offline runs)")
    wall_time: float
    values: dict[str, float]


class RecordsPage(Response):
    """`GET /records`: the records written since the cursor, oldest first."""

    epoch: str = Field(description="this coordinator process's feed; when it changes (the "
                       "coordinator restarted), start again from after=0")
    next: int = Field(description="the cursor to pass as `after` next time")
    latest: int = Field(description="the newest record's sequence number")
    missed: int = Field(description="records after the cursor that are no longer kept "
                        "(the feed keeps the newest 4,000 whole and, of older ones, a "
                        "thinned history per scope)")
    more: bool = Field(description="more records are waiting: ask again at once")
    records: list[LogRecord]
