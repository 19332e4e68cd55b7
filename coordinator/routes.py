"""HTTP routes of the coordinator: parse, call `Coordinator`, answer JSON.

Each route is decorated with `document(...)` (`rlfleet.coordinator.openapi`): what it reads and
answers, for the OpenAPI document at `GET /openapi.json`. It describes, never validates.
"""

from __future__ import annotations

from flask import Blueprint, current_app, jsonify, request

from rlfleet.coordinator.admission import DeviceMissing, NotAdmitted
from rlfleet.coordinator.membership import Superseded, UnknownWorker, WorkerIdTaken
from rlfleet.coordinator.openapi import document, openapi_document
from rlfleet.coordinator.service import Coordinator, RateLimited, StaleGeneration, WrongWorker
from rlfleet.coordinator.tasks import UnknownTask
from rlfleet.shared.contract.sample_wire import MEDIA_TYPE as SAMPLE_MEDIA_TYPE
from rlfleet.shared.contract.sample_wire import encode_sample
from rlfleet.shared.contract.wire.base import API
from rlfleet.shared.contract.wire.control import RunState, ScaleRequest
from rlfleet.shared.contract.wire.evaluation import EvaluationReport, EvaluationResult
from rlfleet.shared.contract.wire.experience import (
    ChunkReport,
    ChunkReportResponse,
    CollectPermitRequest,
    CollectPermitResponse,
)
from rlfleet.shared.contract.wire.group import GroupAssignment, GroupSyncRequest
from rlfleet.shared.contract.wire.membership import (
    HeartbeatRequest,
    HeartbeatResponse,
    RegisterRequest,
    RegisterResponse,
)
from rlfleet.shared.contract.wire.records import RecordsPage, RecordsQuery
from rlfleet.shared.contract.wire.sampling import (
    LearnInfo,
    LearnInfoResponse,
    SamplePart,
    SampleRequest,
    SampleResponse,
)
from rlfleet.shared.contract.wire.status import LeagueView, Status
from rlfleet.shared.contract.wire.tasks import TaskResult
from rlfleet.shared.contract.wire.views import (
    BufferChunks,
    BufferCleared,
    BufferClearRequest,
    BufferInfo,
    BufferList,
    BufferLoaded,
    BufferLoadRequest,
    EvaluationList,
    EvaluationsQuery,
    Health,
    TaskInfo,
    TaskList,
    WorkerInfo,
    WorkerList,
)
from rlfleet.shared.infra.storage import StorageError
from rlfleet.shared.infra.webapp import BadRequest, error, parse_body, parse_query
from rlfleet.shared.replay.replay import BufferRefused, UnknownBuffer

bp = Blueprint("coordinator", __name__)

WORKER_ID = {"worker_id": "the id the worker registered under"}
TASK_ID = {"task_id": "the task's id, as pushed to its worker"}


def coord() -> Coordinator:
    return current_app.extensions["rlfleet"]


def _json(model):
    return current_app.response_class(model.model_dump_json(), mimetype="application/json")


@bp.errorhandler(UnknownWorker)
def _unknown_worker(err: UnknownWorker):
    return error(404, str(err), "worker_id")


@bp.errorhandler(WorkerIdTaken)
def _worker_id_taken(err: WorkerIdTaken):
    """A second process under a live worker's id: refused, so the holder goes on alone."""
    return error(409, str(err), "worker_id", holder_url=err.holder_url)


@bp.errorhandler(Superseded)
def _superseded(err: Superseded):
    """The heartbeat of a process whose id another process took while it was silent."""
    return error(409, str(err), "worker_id", holder_url=err.holder_url)


@bp.errorhandler(NotAdmitted)
def _not_admitted(err: NotAdmitted):
    return error(403, str(err), err.field)


@bp.errorhandler(DeviceMissing)
def _device_missing(err: DeviceMissing):
    """The run's config asks for a GPU the registering worker does not have."""
    return error(409, str(err), err.field)


@bp.errorhandler(UnknownTask)
def _unknown_task(err: UnknownTask):
    return error(404, str(err), "task_id")


@bp.errorhandler(WrongWorker)
def _wrong_worker(err: WrongWorker):
    return error(409, str(err), "task_id")


@bp.errorhandler(StaleGeneration)
def _stale_generation(err: StaleGeneration):
    """The learner group has moved on to another generation: the learner syncs again."""
    return error(409, str(err), err.field)


@bp.errorhandler(StorageError)
def _storage_down(err: StorageError):
    """Storage is out (a Redis restart): nothing was changed or acknowledged; the client's
    retry with backoff is the right response."""
    resp, status = error(503, f"storage unavailable: {err}", None)
    resp.headers["Retry-After"] = "1"
    return resp, status


@bp.errorhandler(UnknownBuffer)
def _unknown_buffer(err: UnknownBuffer):
    return error(404, str(err), err.field)


@bp.errorhandler(BufferRefused)  # a dataset buffer, a queue that would drop a load
def _buffer_refused(err: BufferRefused):
    return error(409, str(err), "name")


@bp.errorhandler(RateLimited)
def _rate_limited(err: RateLimited):
    resp, status = error(429, str(err), None, retry_after_s=err.retry_after_s)
    resp.headers["Retry-After"] = f"{err.retry_after_s:g}"
    return resp, status


@bp.get("/openapi.json")
def openapi():
    """This API as an OpenAPI 3.1 document, generated from the pydantic wire schemas."""
    return jsonify(openapi_document(current_app))


@bp.get("/health")
@document(Health, public=True)
def health():
    return jsonify({"ok": True, "role": "coordinator"})


@bp.get(f"{API}/status")
@document(Status)
def status():
    """`schemas.Status`, dumped to plain JSON values and answered as every dict answer is
    (Flask's JSON: sorted keys, Python's float formatting)."""
    return jsonify(coord().status().model_dump(mode="json"))


@bp.get(f"{API}/records")
@document(RecordsPage, query=RecordsQuery)
def records():
    """The run's log records written since the cursor `after` (the `next` of the previous
    answer), oldest first: what a live page polls to extend its curves."""
    q = parse_query(RecordsQuery)
    page = coord().runlog.feed.since(q.after, q.scopes(), q.limit)
    return jsonify(page)


@bp.get(f"{API}/league")
@document(LeagueView, errors=(404,))
def league():
    """The self-play league with each player's rating history; 404 for a run without one."""
    c = coord()
    if c.matchmaker is None:
        return error(404, "this run has no league (its config has no league: section)",
                     "league")
    return jsonify(c.matchmaker.view(history=True))


@bp.get(f"{API}/workers")
@document(WorkerList)
def list_workers():
    c = coord()
    now = c.clock()
    return jsonify({"workers": [w.to_json(now) for w in c.members.all()]})


@bp.post(f"{API}/workers")
@document(RegisterResponse, body=RegisterRequest, errors=[403, 409])
def register():
    """Join the run, or join it again under the same id: from the same URL (a restart),
    the worker replaces its entry. 403: the worker's URL is outside
    `coordinator.worker_networks`; 409: the config's `learner.device` or `collector.device`
    asks for a GPU the worker's `resources` do not list, or `worker_id` is held by a live
    worker at another URL (heard from within `coordinator.heartbeat_timeout_s` and still
    answering there; the answer's `holder_url` names it): two processes cannot share an id."""
    return _json(coord().register(parse_body(RegisterRequest)))


@bp.get(f"{API}/workers/<worker_id>")
@document(WorkerInfo, errors=[404], path_params=WORKER_ID)
def get_worker(worker_id: str):
    c = coord()
    return jsonify(c.members.get(worker_id).to_json(c.clock()))


@bp.post(f"{API}/workers/<worker_id>/heartbeat")
@document(HeartbeatResponse, body=HeartbeatRequest, errors=[404, 409], path_params=WORKER_ID)
def heartbeat(worker_id: str):
    """404: the id is unknown, left or was declared dead (the worker registers again);
    409: the heartbeat's `url` is not the one the id is registered from now (another
    process took the id while this one was silent past the timeout; this one stops)."""
    return _json(coord().heartbeat(worker_id, parse_body(HeartbeatRequest)))


@bp.delete(f"{API}/workers/<worker_id>")
@document(WorkerInfo, errors=[404], path_params=WORKER_ID)
def leave(worker_id: str):
    c = coord()
    return jsonify(c.leave(worker_id).to_json(c.clock()))


@bp.get(f"{API}/tasks")
@document(TaskList)
def list_tasks():
    return jsonify({"tasks": [r.to_json() for r in coord().tasks.all()]})


@bp.get(f"{API}/tasks/<task_id>")
@document(TaskInfo, errors=[404], path_params=TASK_ID)
def get_task(task_id: str):
    return jsonify(coord().tasks.get(task_id).to_json())


@bp.post(f"{API}/tasks/<task_id>/finish")
@document(TaskInfo, body=TaskResult, errors=[404, 409], path_params=TASK_ID)
def finish_task(task_id: str):
    body = parse_body(TaskResult)
    return jsonify(coord().end_task(task_id, body.worker_id, None).to_json())


@bp.post(f"{API}/tasks/<task_id>/fail")
@document(TaskInfo, body=TaskResult, errors=[404, 409], path_params=TASK_ID)
def fail_task(task_id: str):
    body = parse_body(TaskResult)
    reason = body.error or "failed without a reason"
    return jsonify(coord().end_task(task_id, body.worker_id, reason).to_json())


@bp.post(f"{API}/chunks")
@document(ChunkReportResponse, body=ChunkReport, errors=[404, 409, 503])
def report_chunks():
    return _json(coord().report_chunks(parse_body(ChunkReport)))


@bp.post(f"{API}/permits/collect")
@document(CollectPermitResponse, body=CollectPermitRequest, errors=[404])
def collect_permit():
    return _json(coord().collect_permit(parse_body(CollectPermitRequest)))


@bp.post(f"{API}/learner-group")
@document(GroupAssignment, body=GroupSyncRequest, errors=[404, 409])
def learner_group_sync():
    """A learner joins the learner group, asks for its current generation, or reports that
    a collective of its generation failed (`broken`): the group re-forms."""
    return _json(coord().group_sync(parse_body(GroupSyncRequest)))


@bp.post(f"{API}/sample")
@document(SampleResponse, body=SampleRequest, errors=[404, 409, 429])
def sample():
    """Sample references for `num_batches` batches. With `Accept: application/x-rlfleet-
    sample+safetensors` the answer is the same fields with the index arrays in one
    safetensors body (`shared/contract/sample_wire.py`): what the learner's data process asks
    for."""
    grant = coord().sample(parse_body(SampleRequest))
    fields = dict(chunk_ids=grant.chunk_ids, num_batches=grant.num_batches,
                  env_steps=grant.env_steps, train_iterations=grant.train_iterations,
                  policy_version=grant.policy_version, stop=grant.stop,
                  group_generation=grant.group_generation, first_seq=grant.first_seq)
    if request.accept_mimetypes.best == SAMPLE_MEDIA_TYPE:
        return current_app.response_class(encode_sample(fields, grant.parts),
                                           mimetype=SAMPLE_MEDIA_TYPE)
    return _json(SampleResponse(**fields, parts=[SamplePart(
        buffer=p.buffer, key=p.key, chunk_index=p.chunk_index.tolist(),
        rows=p.rows.tolist(), item_ids=p.item_ids.tolist(),
        weights=None if p.weights is None else p.weights.tolist(),
        sequence_length=p.sequence_length,
        lengths=None if p.lengths is None else p.lengths.tolist()) for p in grant.parts]))


@bp.get(f"{API}/buffers")
@document(BufferList)
def list_buffers():
    return jsonify({"buffers": coord().readout.buffers()})


@bp.get(f"{API}/buffers/<name>")
@document(BufferInfo, errors=[404], path_params={"name": "the buffer's name in the config"})
def get_buffer(name: str):
    buffers = coord().readout.buffers()
    if name not in buffers:
        raise UnknownBuffer(name, "name")
    return jsonify({"name": name, **buffers[name]})


@bp.get(f"{API}/buffers/<name>/chunks")
@document(BufferChunks, errors=[404], path_params={"name": "the buffer's name in the config"})
def buffer_chunks(name: str):
    return _json(BufferChunks(name=name, chunk_ids=coord().readout.buffer_chunks(name)))


@bp.post(f"{API}/buffers/<name>/clear")
@document(BufferCleared, body=BufferClearRequest, errors=[404, 409, 503],
          path_params={"name": "the buffer's name in the config"})
def clear_buffer(name: str):
    """Empty the buffer: its items and priorities go, its chunks are released as evicted
    ones are (deleted from storage once no other buffer holds them, after the next
    snapshot), and its items count as dropped, so the rate limiter waits for fresh items
    before sampling again. Journalled: a restarted coordinator replays it. 409: a dataset
    buffer (its items are its dataset); 503: storage is out, nothing was cleared."""
    parse_body(BufferClearRequest)
    return _json(coord().clear_buffer(name))


@bp.post(f"{API}/buffers/<name>/load")
@document(BufferLoaded, body=BufferLoadRequest, errors=[404, 409, 503],
          path_params={"name": "the buffer's name in the config"})
def load_buffer(name: str):
    """Index chunks already written to the run's storage in this buffer only (what
    `rlfleet buffer load` sends): journalled like a collector's report, counted as
    acknowledged chunks but not as env steps. 409: a dataset buffer."""
    return _json(coord().load_buffer(name, parse_body(BufferLoadRequest)))


@bp.post(f"{API}/learn-info")
@document(LearnInfoResponse, body=LearnInfo, errors=[404])
def learn_info():
    return _json(coord().learn_info(parse_body(LearnInfo)))


@bp.post(f"{API}/evaluations")
@document(EvaluationResult, body=EvaluationReport, errors=[404, 409])
def report_evaluation():
    return _json(coord().report_evaluation(parse_body(EvaluationReport)))


@bp.get(f"{API}/evaluations")
@document(EvaluationList, query=EvaluationsQuery)
def list_evaluations():
    """The run's evaluations after the cursor `since`, oldest first, a page at a time; the
    coordinator keeps the newest 500 (the whole history is in `metrics.jsonl`)."""
    q = parse_query(EvaluationsQuery)
    return _json(coord().eval_schedule.page(q.since, q.limit))


@bp.get(f"{API}/run")
@document(RunState)
def run_state():
    return _json(coord().run_state())


@bp.post(f"{API}/run/stop")
@document(RunState)
def stop_run():
    c = coord()
    c.stop("stopped by request")
    return _json(c.run_state())


@bp.post(f"{API}/run/pause")
@document(RunState)
def pause_collection():
    return _json(coord().set_paused(True))


@bp.post(f"{API}/run/resume")
@document(RunState)
def resume_collection():
    return _json(coord().set_paused(False))


@bp.post(f"{API}/scale")
@document(RunState, body=ScaleRequest)
def scale():
    c = coord()
    req = parse_body(ScaleRequest)
    if req.collectors is None and req.learners is None:
        raise BadRequest("collectors: give collectors, learners or both", "collectors")
    if req.learners is not None:
        problem = c.cfg.group_problem(req.learners)
        if problem:
            raise BadRequest(f"learners: {req.learners} learners cannot share this run's "
                             f"work: {problem}", "learners")
    return _json(c.scale(req.collectors, req.learners))
