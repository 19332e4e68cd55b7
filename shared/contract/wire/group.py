"""The data-parallel learner group (learner <-> coordinator): which generation of the
group a learner is in, and its place there.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from rlfleet.shared.contract.wire.base import MAX_COUNT, Id, Request, Response

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
