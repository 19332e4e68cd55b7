"""Evaluation (collector -> coordinator): the episodes of an evaluation task, and the
result the coordinator keeps of them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, StrictBool, model_validator

from rlfleet.shared.contract.wire.base import (
    Count,
    Finite,
    Id,
    Request,
    Response,
    Return,
    SuccessRate,
    Version,
)
from rlfleet.shared.contract.wire.tasks import PlayerName

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
