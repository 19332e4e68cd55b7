"""Experience (collector -> coordinator): the metadata of the chunks a collector wrote to
storage, and the permit a throttled collector waits for. Payload data never appears
here: chunks travel through storage.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from rlfleet.shared.contract.wire.base import Count, Finite, Id, Request, Response, Return, Version
from rlfleet.shared.contract.wire.tasks import GameRecord, Opponent, PlayerName


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


class CollectPermitRequest(Request):
    """Asked by a collector the coordinator told to throttle: wait until collecting may go on."""

    worker_id: Id
    wait_s: float = Field(1.0, ge=0, le=30)


class CollectPermitResponse(Response):
    granted: bool
    stop: bool
