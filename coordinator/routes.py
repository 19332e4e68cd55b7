"""HTTP routes of the coordinator: parse, call `Coordinator`, answer JSON."""

from __future__ import annotations

from flask import Blueprint, current_app, jsonify

from coordinator.membership import UnknownWorker
from coordinator.replay import UnknownBuffer
from coordinator.service import Coordinator, RateLimited, WrongWorker
from coordinator.tasks import UnknownTask
from shared.schemas import (
    API,
    ChunkReport,
    CollectPermitRequest,
    EvaluationReport,
    HeartbeatRequest,
    LearnInfo,
    RegisterRequest,
    SamplePart,
    SampleRequest,
    SampleResponse,
    TaskResult,
)
from shared.webapp import error, parse_body

bp = Blueprint("coordinator", __name__)


def coord() -> Coordinator:
    return current_app.extensions["rlfleet"]


def _json(model):
    return current_app.response_class(model.model_dump_json(), mimetype="application/json")


@bp.errorhandler(UnknownWorker)
def _unknown_worker(err: UnknownWorker):
    return error(404, str(err), "worker_id")


@bp.errorhandler(UnknownTask)
def _unknown_task(err: UnknownTask):
    return error(404, str(err), "task_id")


@bp.errorhandler(WrongWorker)
def _wrong_worker(err: WrongWorker):
    return error(409, str(err), "task_id")


@bp.errorhandler(UnknownBuffer)
def _unknown_buffer(err: UnknownBuffer):
    return error(404, str(err), err.field)


@bp.errorhandler(RateLimited)
def _rate_limited(err: RateLimited):
    resp, status = error(429, str(err), None, retry_after_s=err.retry_after_s)
    resp.headers["Retry-After"] = f"{err.retry_after_s:g}"
    return resp, status


@bp.get("/health")
def health():
    return jsonify({"ok": True, "role": "coordinator"})


@bp.get(f"{API}/status")
def status():
    return jsonify(coord().status())


@bp.get(f"{API}/workers")
def list_workers():
    c = coord()
    now = c.clock()
    return jsonify({"workers": [w.to_json(now) for w in c.members.all()]})


@bp.post(f"{API}/workers")
def register():
    return _json(coord().register(parse_body(RegisterRequest)))


@bp.get(f"{API}/workers/<worker_id>")
def get_worker(worker_id: str):
    c = coord()
    return jsonify(c.members.get(worker_id).to_json(c.clock()))


@bp.post(f"{API}/workers/<worker_id>/heartbeat")
def heartbeat(worker_id: str):
    return _json(coord().heartbeat(worker_id, parse_body(HeartbeatRequest)))


@bp.delete(f"{API}/workers/<worker_id>")
def leave(worker_id: str):
    c = coord()
    return jsonify(c.leave(worker_id).to_json(c.clock()))


@bp.get(f"{API}/tasks")
def list_tasks():
    return jsonify({"tasks": [r.to_json() for r in coord().tasks.all()]})


@bp.get(f"{API}/tasks/<task_id>")
def get_task(task_id: str):
    return jsonify(coord().tasks.get(task_id).to_json())


@bp.post(f"{API}/tasks/<task_id>/finish")
def finish_task(task_id: str):
    body = parse_body(TaskResult)
    return jsonify(coord().end_task(task_id, body.worker_id, None).to_json())


@bp.post(f"{API}/tasks/<task_id>/fail")
def fail_task(task_id: str):
    body = parse_body(TaskResult)
    reason = body.error or "failed without a reason"
    return jsonify(coord().end_task(task_id, body.worker_id, reason).to_json())


@bp.post(f"{API}/chunks")
def report_chunks():
    return _json(coord().report_chunks(parse_body(ChunkReport)))


@bp.post(f"{API}/permits/collect")
def collect_permit():
    return _json(coord().collect_permit(parse_body(CollectPermitRequest)))


@bp.post(f"{API}/sample")
def sample():
    c = coord()
    chunk_ids, parts, granted, env_steps = c.sample(parse_body(SampleRequest))
    return _json(SampleResponse(
        chunk_ids=chunk_ids, num_batches=granted, env_steps=env_steps,
        train_iterations=c.train_iterations, policy_version=c.policy_version, stop=c.stopped,
        parts=[SamplePart(
            buffer=p.buffer, key=p.key, chunk_index=p.chunk_index.tolist(),
            rows=p.rows.tolist(), item_ids=p.item_ids.tolist(),
            weights=None if p.weights is None else p.weights.tolist(),
            sequence_length=p.sequence_length,
            lengths=None if p.lengths is None else p.lengths.tolist()) for p in parts]))


@bp.get(f"{API}/buffers")
def list_buffers():
    c = coord()
    return jsonify({"buffers": c.status()["buffers"]})


@bp.get(f"{API}/buffers/<name>")
def get_buffer(name: str):
    buffers = coord().status()["buffers"]
    if name not in buffers:
        raise UnknownBuffer(name, "name")
    return jsonify({"name": name, **buffers[name]})


@bp.post(f"{API}/learn-info")
def learn_info():
    return _json(coord().learn_info(parse_body(LearnInfo)))


@bp.post(f"{API}/evaluations")
def report_evaluation():
    return _json(coord().report_evaluation(parse_body(EvaluationReport)))


@bp.get(f"{API}/evaluations")
def list_evaluations():
    return jsonify({"evaluations": [e.model_dump() for e in coord().evaluations]})
