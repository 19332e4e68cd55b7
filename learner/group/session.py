"""A learner's session in the run's learner group: its place, generation after generation.

Every learner is a member of the group, even alone. It asks the coordinator for its place
(`POST /api/v1/learner-group`) and waits as a standby while it has none; it forms the
generation it is given (`learner/group/member.py` carries out the rendezvous) and adopts rank 0's
training state and policy version, so survivors and newcomers continue from one state; it
trains until the generation ends, then asks again. A generation ends when the coordinator
says so (a heartbeat telling of a newer one, or a 409 to a sample request, which the feeds
notice) or when one of its collectives fails (`GroupError`, reported as `broken` with the
next sync so the coordinator re-forms the group). A rank stuck in a collective with a frozen
rank asks the coordinator while it waits (`generation_ended`), so it stops waiting as soon
as the coordinator declares the frozen rank dead, not at the collective's timeout.

A group of one trains exactly as a lone learner: no process group, no broadcast. Only the
publisher (rank 0) publishes policy versions and writes checkpoints.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from rlfleet.learner.group.member import GroupError, GroupMember
from rlfleet.learner.output.publisher import PublishConflict, Publisher
from rlfleet.shared.algos.base import Policy
from rlfleet.shared.algos.capabilities import DataParallel
from rlfleet.shared.contract.config import ConfigError
from rlfleet.shared.contract.wire.base import API
from rlfleet.shared.contract.wire.group import GroupAssignment, GroupSyncRequest
from rlfleet.shared.contract.wire.membership import HeartbeatResponse
from rlfleet.shared.infra.http import HttpError
from rlfleet.shared.infra.storage import Storage, StorageError
from rlfleet.shared.worker import WorkerAgent

log = logging.getLogger("rlfleet.learner")

SYNC_RETRY_S = 0.5   # after a failed sync: the coordinator may be restarting
STANDBY_POLL_S = 1.0  # a standby asks again this often for a place
# A rank waiting this long in a collective asks the coordinator for the group's generation,
# then every ASK_EVERY_S: ranks step in lockstep, so short waits for a slower rank are normal.
ASK_AFTER_S = 1.0
ASK_EVERY_S = 0.2
ASK_TIMEOUT_S = 1.0


class GroupSession:
    """This learner's membership: the current assignment, its process group, and what
    `/status` and heartbeats say of it. Used by the training thread only, except
    `on_heartbeat` (the agent's thread: one assignment) and the status readers."""

    def __init__(self, agent: WorkerAgent, publisher: Publisher,
                 closing: threading.Event) -> None:
        self.agent = agent
        self.publisher = publisher
        self._closing = closing
        self.member: GroupMember | None = None
        self.assignment: GroupAssignment | None = None
        self.generation_seen: int | None = None  # from the last heartbeat
        self.formations = 0
        self._formed_ok = False  # in a process group of the current assignment
        self._allreduce_s = 0.0  # in collectives of generations before the current one
        self._asked_at = 0.0  # when a stalled collective last asked the coordinator

    def open(self, member: GroupMember) -> None:
        """Take part through `member` (its store listens from now on)."""
        self.member = member
        member.ended = self.generation_ended

    def close(self) -> None:
        if self.member is not None:
            self.member.close()

    @property
    def is_publisher(self) -> bool:
        """Publishes policy versions and writes checkpoints: rank 0 of the group."""
        return self.assignment is None or self.assignment.publisher

    @property
    def world_size(self) -> int:
        return self.assignment.world_size if self.assignment else 1

    def allreduce_seconds(self) -> float:
        """Seconds in collectives, over every generation this learner was in."""
        reducer = self.member.reducer if self.member else None
        return self._allreduce_s + (reducer.seconds if reducer else 0.0)

    def run(self, policy: Policy, storage: Storage,
            formed: Callable[[GroupAssignment], None], train: Callable[[], bool]) -> None:
        """Join a generation, train in it until it ends, join the next; until the run ends.
        `formed` runs once a generation is formed (the publisher announces a version);
        `train` trains until the run ends (True) or the generation does (False)."""
        broken: str | None = None
        while not self._closing.is_set():
            assignment = self.sync(broken)
            if assignment is None:
                return
            broken = None
            try:
                if self.assignment is None or assignment.generation != \
                        self.assignment.generation or not self._formed_ok:
                    self.form(assignment, policy, storage)
                    formed(assignment)
                over = train()
            except GroupError as err:
                log.warning("learner group generation %d broke: %s", assignment.generation,
                            err)
                self._formed_ok = False
                broken = str(err)[:2000]
                continue
            if over:
                return

    def sync(self, broken: str | None) -> GroupAssignment | None:
        """This learner's place in the current generation; waits as a standby while it has
        none. None when the learner is closing."""
        assert self.member is not None
        req = GroupSyncRequest(worker_id=self.agent.worker_id,
                               store_addr=self.member.store_addr,
                               generation=self.assignment.generation if self.assignment
                               else None, broken=broken)
        while not self._closing.is_set():
            try:
                got = self.agent.client.post(f"{API}/learner-group", req, GroupAssignment)
            except HttpError as err:
                log.warning("learner group sync failed: %s", err)
                self._closing.wait(SYNC_RETRY_S)
                continue
            self.generation_seen = None
            if got.rank is not None:
                return got
            if self.assignment is None or self.assignment.generation != got.generation:
                log.info("standby in learner group generation %d (%d ranks)", got.generation,
                         got.world_size)
                self.leave_generation()
                self.assignment = got
            req = req.model_copy(update={"broken": None, "generation": got.generation})
            self._closing.wait(STANDBY_POLL_S)
        return None

    def form(self, assignment: GroupAssignment, policy: Policy, storage: Storage) -> None:
        """Join `assignment`'s process group and adopt rank 0's state and policy version
        (the publisher then announces a version of its own: `formed` in `run`)."""
        assert self.member is not None
        if assignment.world_size > 1 and not isinstance(policy, DataParallel):
            raise ConfigError(f"algo.policy={type(policy).__name__} is not DataParallel (it "
                              "has no set_reducer): it cannot learn in a group; use "
                              "learner.count: 1")
        self.leave_generation()
        self.assignment = assignment
        try:  # versions handed over in the last generation go out before this one's
            self.publisher.flush()
        except PublishConflict as err:
            log.info("the last generation's pending version was not published: %s", err)
        reducer = self.member.form(assignment)
        if isinstance(policy, DataParallel):
            policy.set_reducer(reducer)
        latest = self.publisher.version
        if assignment.publisher:
            try:  # another rank may have published since this one last looked
                latest = max(latest, storage.latest_version() or -1)
            except StorageError as err:
                log.warning("latest policy version unknown (%s): going on from %d", err, latest)
        if assignment.world_size > 1:
            state, latest = self.member.broadcast_state(
                policy.state_dict() if assignment.rank == 0 else None, latest)
            if assignment.rank != 0:
                policy.load_state_dict(state)
        self.publisher.attach(storage, latest)
        self._formed_ok = True
        self.formations += 1
        log.info("learner group generation %d formed: rank %s of %d, train iteration %d, "
                 "policy version %d", assignment.generation, assignment.rank,
                 assignment.world_size, policy.train_iterations, self.publisher.version)

    def leave_generation(self) -> None:
        assert self.member is not None
        self._allreduce_s = self.allreduce_seconds()
        self.member.leave()
        self._formed_ok = False

    def generation_moved(self) -> bool:
        """A heartbeat told of a newer generation. Only newer: an answer sent before this
        learner's last sync may tell of an older one (a coordinator that restarted and
        counts generations anew answers the next sample request with 409 instead)."""
        seen = self.generation_seen
        return (self.assignment is not None and seen is not None
                and seen > self.assignment.generation)

    def generation_ended(self, stalled_s: float) -> bool:
        """Asked between slices of a wait for a collective (the training thread): whether
        the coordinator has ended this generation, so the collective may never complete.
        The last heartbeat's word first; after `ASK_AFTER_S`, the coordinator's own, every
        `ASK_EVERY_S`: it re-forms the group the moment it declares a frozen rank dead, and
        the next heartbeat may be a whole interval later. Asking is a sync that names this
        generation: it changes nothing while the generation goes on."""
        if self.generation_moved():
            return True
        now = time.monotonic()
        a = self.assignment
        if a is None or self.member is None or stalled_s < ASK_AFTER_S \
                or now - self._asked_at < ASK_EVERY_S:
            return False
        self._asked_at = now
        req = GroupSyncRequest(worker_id=self.agent.worker_id,
                               store_addr=self.member.store_addr, generation=a.generation)
        try:
            got = self.agent.client.post(f"{API}/learner-group", req, GroupAssignment,
                                         retries=0, timeout_s=ASK_TIMEOUT_S)
        except HttpError as err:  # the coordinator cannot say: the collective's timeout will
            log.debug("asking for the group's generation: %s", err)
            return False
        if got.generation != a.generation or got.epoch != a.epoch:
            log.info("learner group generation %d ended while this rank waited %.1fs in a "
                     "collective: now generation %d, %d rank(s)", a.generation, stalled_s,
                     got.generation, got.world_size)
            return True
        return False

    def on_heartbeat(self, hb: HeartbeatResponse) -> None:
        if hb.group_generation is not None:
            self.generation_seen = hb.group_generation

    def heartbeat_status(self) -> dict[str, float]:
        """The group fields of a heartbeat (-1 and 0 before any assignment)."""
        a = self.assignment
        return {"group_generation": float(a.generation if a else -1),
                "group_rank": float(a.rank if a and a.rank is not None else -1),
                "group_world_size": float(a.world_size if a else 0)}

    def status(self) -> dict[str, Any] | None:
        """`/status`'s `group`; None before the first sync answered."""
        a = self.assignment
        if a is None:
            return None
        return {"generation": a.generation, "rank": a.rank, "world_size": a.world_size,
                "publisher": a.publisher, "ranks": a.ranks, "formations": self.formations,
                "allreduce_s": round(self.allreduce_seconds(), 3),
                "backend": getattr(self.member, "backend", None),
                "store_addr": self.member.store_addr if self.member else None}
