"""Run control (operator -> coordinator): the run's scale, and its state."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlfleet.shared.contract.wire.base import Request, Response


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
