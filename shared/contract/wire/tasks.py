"""Tasks (coordinator -> worker, `POST /task`), what a worker answers, and how it says a
task ended.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from rlfleet.shared.contract.wire.base import (
    Count,
    EnvKwargs,
    Id,
    LevelSeeds,
    Request,
    Response,
    TaskKind,
    Version,
)

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
    """What one collector collects with. How it cuts chunks (`collector.mode`, `chunk_size`,
    `episodes_per_chunk`) is the run config's, which it received when it registered."""

    kind: Literal[TaskKind.COLLECT] = TaskKind.COLLECT
    task_id: Id
    seed: int
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


class TaskResult(Request):
    """A worker telling the coordinator a task ended (`POST /tasks/<id>/finish|fail`)."""

    worker_id: Id | None = None
    error: str | None = Field(None, max_length=4096)
