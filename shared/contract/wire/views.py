"""Read-only views (coordinator GET routes) of the cluster's parts: its workers, tasks,
buffers (and the buffer operations beside them) and evaluations.

What the coordinator's GET routes answer. The coordinator builds most of these as plain
dicts (they mirror its internal records); these models describe them for the OpenAPI
document, so a client, or schemathesis, can check an answer without reading the
coordinator's code.
"""

from __future__ import annotations

from pydantic import ConfigDict, Field

from rlfleet.shared.contract.wire.base import (
    Count,
    Finite,
    Request,
    Response,
    Role,
    TaskKind,
    TaskState,
    WorkerState,
)
from rlfleet.shared.contract.wire.evaluation import EvaluationResult
from rlfleet.shared.contract.wire.experience import ChunkMeta
from rlfleet.shared.contract.wire.membership import WorkerResources
from rlfleet.shared.contract.wire.tasks import Task


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
