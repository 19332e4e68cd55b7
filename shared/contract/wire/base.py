"""What every wire schema stands on: the API's prefix, the bounded scalar types, the
request and response bases, the roles' and tasks' states, and the error body.

Requests forbid unknown fields, so a misspelt field is a 400 that names it rather than a
silently ignored value.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

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
