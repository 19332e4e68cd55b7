"""Sampling: a learner's request for batches, granted when the rate limits allow, as a
`SampleGrant`.

A learner alone gets its batches sampled for it. A rank of the learner group gets its shard
of the group's batches (`learner_group.py`): sampled once for the whole group by whichever
rank asks first, kept until every rank has had its shard. A request waits, up to its
`wait_s`, on the state's lock's condition for a chunk report or a learner's progress to make
batches grantable; with nothing granted by then it is refused (`RateLimited`, 429).

Every field of the answer to `POST /sample` is read under the state's lock, at the moment the
batches were granted, so the counters it reports (env steps, train iterations, policy
version, stop, the group's generation) describe the same moment as the chunks it names; the
route builds its answer from the grant alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rlfleet.coordinator.durability import Durability
from rlfleet.coordinator.learner_group import LearnerGroup
from rlfleet.coordinator.membership import Membership
from rlfleet.coordinator.state import CoordinatorState
from rlfleet.shared.contract.wire.sampling import SampleRequest
from rlfleet.shared.replay.replay import PartRefs, Replay
from rlfleet.shared.run.config import RunConfig


class RateLimited(Exception):
    """Nothing may be sampled now; try again after `retry_after_s`."""

    def __init__(self, retry_after_s: float) -> None:
        super().__init__(f"rate limited: retry after {retry_after_s}s")
        self.retry_after_s = retry_after_s


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


class Sampler:
    def __init__(self, cfg: RunConfig, clock: Callable[[], float], state: CoordinatorState, *,
                 members: Membership, replay: Replay, group: LearnerGroup,
                 durability: Durability) -> None:
        self.cfg = cfg
        self.clock = clock
        self.state = state
        self.members = members
        self.replay = replay
        self.group = group
        self.durability = durability  # deletes what sampling released (a queue's chunks)

    def sample(self, req: SampleRequest) -> SampleGrant:
        """Batches for a learner, or its rank's shard of the group's (`group_generation`).
        Raises `RateLimited` when nothing could be granted within `wait_s`."""
        self.members.touch(req.worker_id)
        if req.group_generation is not None:
            return self._sample_group(req)
        plan = self.replay.plan(req)
        deadline = self.clock() + req.wait_s
        state = self.state
        dead: list[str] = []
        with state.cond:
            while True:
                count = self.replay.grantable(plan, req.num_batches)
                if count > 0 or state.stopped or state.closing.is_set():
                    break
                left = deadline - self.clock()
                if left <= 0:
                    raise RateLimited(0.05)
                state.cond.wait(left)
            if count <= 0:
                return SampleGrant.now(state, None, [], [], 0)
            chunk_ids, parts, dead = self.replay.sample(plan, count, state.train_iterations,
                                                        state.policy_version, req.worker_id)
            state.granted_batches += count
            state.cond.notify_all()  # collectors waiting for the learner may go on
            grant = SampleGrant.now(state, None, chunk_ids, parts, count)
        if dead:
            self.durability.release(dead)
        return grant

    def _sample_group(self, req: SampleRequest) -> SampleGrant:
        """This rank's shard of the group batches (or rollout) starting at `group_cursor`:
        sampled once for the whole group, at the global batch size, by whichever rank asks
        first; the others get their shards of the same batches."""
        assert req.group_generation is not None and req.group_cursor is not None
        plan = self.replay.plan(req)
        queue = self.replay.queue_buffer(plan)
        deadline = self.clock() + req.wait_s
        dead: list[str] = []
        state = self.state
        with state.cond:
            while True:
                rank = self.group.rank_of(req.worker_id, req.group_generation)
                entry = self.group.cached(rank, req.group_cursor)
                if entry is not None or state.stopped or state.closing.is_set():
                    break
                if queue is not None:
                    entry, released = self.group.form_rollout(
                        self.replay, queue, self.cfg.rollout_rows, state.train_iterations,
                        state.policy_version)
                    dead += released
                    if entry is not None:
                        state.granted_batches += 1
                        break
                elif not self.group.backlog_full():
                    self.group.check_plan(plan)
                    count = self.replay.grantable(plan, req.num_batches)
                    if count > 0:
                        ids, parts, released = self.replay.sample(
                            plan, count, state.train_iterations, state.policy_version)
                        dead += released
                        entry = self.group.add_batches(ids, parts, count)
                        state.granted_batches += count
                        state.cond.notify_all()
                        break
                left = deadline - self.clock()
                if left <= 0:
                    break
                state.cond.wait(left)
            if entry is not None:
                chunk_ids, parts = entry.shards[rank]
                grant = SampleGrant.now(state, self.group, chunk_ids, parts, entry.count,
                                        entry.first_seq)
            elif state.stopped or state.closing.is_set():
                grant = SampleGrant.now(state, self.group, [], [], 0, req.group_cursor)
            else:
                grant = None
        if dead:
            self.durability.release(dead)
        if grant is None:
            raise RateLimited(0.05)
        return grant


__all__ = ["RateLimited", "SampleGrant", "Sampler"]
