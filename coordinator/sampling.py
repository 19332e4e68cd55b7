"""What a learner's sample request is granted: `SampleGrant`.

Every field of the answer to `POST /sample` is read under the state's lock, at the moment the
batches were granted, so the counters it reports (env steps, train iterations, policy
version, stop, the group's generation) describe the same moment as the chunks it names; the
route builds its answer from the grant alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlfleet.coordinator.learner_group import LearnerGroup
from rlfleet.coordinator.state import CoordinatorState
from rlfleet.shared.replay.replay import PartRefs


@dataclass(frozen=True)
class SampleGrant:
    """The batches granted to one sample request, and the run as it stood then."""

    chunk_ids: list[str]
    parts: list[PartRefs]
    num_batches: int  # granted; 0: the run stopped (or the coordinator is closing) first
    env_steps: int
    train_iterations: int
    policy_version: int
    stop: bool
    group_generation: int | None  # the group's generation, for a group shard only
    first_seq: int | None  # group shards only: the sequence number of the first batch

    @classmethod
    def now(cls, state: CoordinatorState, group: LearnerGroup | None, chunk_ids: list[str],
            parts: list[PartRefs], num_batches: int, first_seq: int | None = None
            ) -> SampleGrant:
        """A grant with the run's counters as they are (under `state.cond`); `group`: the
        learner group, for a group shard (None for a learner's own sample)."""
        return cls(chunk_ids=chunk_ids, parts=parts, num_batches=num_batches,
                   env_steps=state.env_steps, train_iterations=state.train_iterations,
                   policy_version=state.policy_version, stop=state.stopped,
                   group_generation=group.generation if group is not None else None,
                   first_seq=first_seq)


__all__ = ["SampleGrant"]
