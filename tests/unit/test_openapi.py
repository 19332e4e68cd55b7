"""The coordinator's OpenAPI document (`GET /openapi.json`): valid, complete, and true.

"Complete" is checked against the app's own url_map, so a route added without `document(...)`
fails here. "True" is checked by schemathesis: it generates requests from the document (valid
ones and invalid ones) against a real coordinator process started with a token, and every
answer must be documented (status, content type, headers, body schema) and never a 5xx.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Iterator

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from openapi_spec_validator import validate
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from rlfleet.coordinator.app import create_app
from rlfleet.shared.contract.wire.base import API
from rlfleet.shared.infra.auth import TOKEN_ENV, TOKEN_FILE_ENV
from rlfleet.shared.run.config import parse_config

from .helpers import TIMEOUT, CoordinatorProc, make_config, wait_for

TOKEN = "openapi-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_headers_conformance, response_schema_conformance]
# Generated examples per operation and mode. Operations without parameters or a body have
# one possible request, which Hypothesis sends once; the others share the rest.
EXAMPLES = {GenerationMode.POSITIVE: 45, GenerationMode.NEGATIVE: 30}
MIN_REQUESTS = 1000


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory):
    """An app that never starts its threads: enough to read its routes and its document."""
    tmp = tmp_path_factory.mktemp("openapi")
    with pytest.MonkeyPatch.context() as mp:  # a developer's token must not guard it
        mp.delenv(TOKEN_ENV, raising=False)
        mp.delenv(TOKEN_FILE_ENV, raising=False)
        app = create_app(parse_config(make_config()), str(tmp / "storage"), tmp / "run",
                         start=False)
    yield app
    app.extensions["rlfleet"].close()


@pytest.fixture(scope="module")
def doc(app) -> dict:
    resp = app.test_client().get("/openapi.json")
    assert resp.status_code == 200 and resp.mimetype == "application/json"
    return resp.json


def _operations(doc: dict) -> Iterator[tuple[str, str, dict]]:
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            yield path, method, op


def _ref(content: dict) -> str:
    return content["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]


def test_the_document_is_valid_openapi_3(doc: dict) -> None:
    assert doc["openapi"].startswith("3.")
    validate(doc)  # raises, naming the offending part, when it is not


def test_every_api_route_is_documented(app, doc: dict) -> None:
    routes = set()
    for rule in app.url_map.iter_rules():
        if rule.rule.startswith(API):
            path = re.sub(r"<(?:[^:<>]+:)?([^<>]+)>", r"{\1}", rule.rule)
            routes |= {(path, m.lower()) for m in rule.methods - {"HEAD", "OPTIONS"}}
    documented = {(path, method) for path, method, _ in _operations(doc)}
    assert routes, "no route under /api/v1?"
    assert routes - documented == set(), "routes missing from the OpenAPI document"
    assert documented - routes == {("/health", "get")}
    for path, _, op in _operations(doc):
        params = {p["name"]: p for p in op["parameters"] if p["in"] == "path"}
        assert set(params) == set(re.findall(r"{(\w+)}", path)), path
        assert all(p["description"] and p["required"] for p in params.values()), path


def test_bodies_and_answers_are_the_pydantic_models(doc: dict) -> None:
    ops = {(path, method): op for path, method, op in _operations(doc)}
    chunks, sample = ops[(f"{API}/chunks", "post")], ops[(f"{API}/sample", "post")]
    assert _ref(chunks["requestBody"]["content"]) == "ChunkReport"
    assert chunks["requestBody"]["required"] is True
    assert _ref(chunks["responses"]["200"]["content"]) == "ChunkReportResponse"
    assert _ref(sample["requestBody"]["content"]) == "SampleRequest"
    assert sample["responses"]["429"]["headers"]["Retry-After"]["required"] is True
    # All its fields are optional: `parse_body` takes a missing body as `{}`.
    assert ops[(f"{API}/workers/{{worker_id}}/heartbeat", "post")]["requestBody"][
        "required"] is False
    assert _ref(ops[(f"{API}/status", "get")]["responses"]["200"]["content"]) == "Status"
    schemas = doc["components"]["schemas"]
    assert {"ChunkMeta", "SampleRequest", "ErrorBody", "TaskInfo", "WorkerInfo"} <= set(schemas)
    for path, method, op in _operations(doc):
        errors = {code for code in op["responses"] if code >= "400"}
        for code in errors:
            assert _ref(op["responses"][code]["content"]) == "ErrorBody", (path, method, code)
        if "requestBody" in op:
            assert {"400", "413"} <= errors, (path, method)
        if path == "/health":
            assert op["security"] == [] and "401" not in errors
        else:
            assert "security" not in op and "401" in errors, (path, method)
    assert doc["security"] == [{"bearerAuth": []}]
    assert doc["components"]["securitySchemes"]["bearerAuth"] == {
        "type": "http", "scheme": "bearer",
        "description": doc["components"]["securitySchemes"]["bearerAuth"]["description"]}


# Bodies that must not get past validation: numbers beyond int64 would make numpy raise (a
# 500), and `1e400` (valid JSON, parsed as inf) would come back out of GET /workers and
# /status as `Infinity`, which is not JSON.
OUT_OF_RANGE = [
    ("/workers/{learner}/heartbeat", '{"status": {"loss": 1e400}}', "status.loss"),
    ("/workers/{learner}/heartbeat", '{"status": {"loss": NaN}}', "status.loss"),
    ("/learn-info", '{"worker_id": "{learner}", "train_iterations": 1e30, '
     '"policy_version": 0}', "train_iterations"),
    ("/learn-info", '{"worker_id": "{learner}", "train_iterations": 1, '
     '"policy_version": 100000000000000000000000}', "policy_version"),
    ("/learn-info", '{"worker_id": "{learner}", "train_iterations": 1, "policy_version": 0, '
     '"priorities": [{"buffer": "replay", "item_ids": [100000000000000000000000], '
     '"priorities": [1.0]}]}', "priorities.0.item_ids.0"),
    ("/sample", '{"worker_id": "{learner}", "batch_size": 1, "num_batches": 1, '
     '"by_buffer": {"replay": 0}}', "by_buffer.replay"),
]


@pytest.mark.parametrize(("path", "raw", "field"), OUT_OF_RANGE)
def test_numbers_out_of_range_are_a_400_naming_the_field(app, path: str, raw: str,
                                                         field: str) -> None:
    client = app.test_client()
    learner = client.post(f"{API}/workers", json={"role": "learner",
                                                  "url": "http://127.0.0.1:9"}).json["worker_id"]
    resp = client.post(API + path.replace("{learner}", learner),
                       data=raw.replace("{learner}", learner), content_type="application/json")
    assert resp.status_code == 400, resp.text
    assert resp.json["field"] == field
    assert client.get(f"{API}/status").status_code == 200


# -- against a live coordinator -------------------------------------------------------------

@pytest.fixture
def guarded(coordinator) -> CoordinatorProc:
    """A coordinator that requires the token (never a prewarmed spare: those have none)."""
    return coordinator(environ={TOKEN_ENV: TOKEN})


def test_every_guarded_operation_refuses_a_request_without_the_token(
        guarded: CoordinatorProc, doc: dict) -> None:
    for path, method, op in _operations(doc):
        url = guarded.url + re.sub(r"{\w+}", "x", path)
        resp = requests.request(method, url, json={}, timeout=TIMEOUT,
                                headers={"Connection": "close"})
        if op.get("security") == []:
            assert resp.status_code == 200, (path, method)
            continue
        assert resp.status_code == 401, (path, method, resp.status_code, resp.text)
        assert resp.headers["WWW-Authenticate"] == "Bearer"
        assert resp.json()["field"] == "Authorization"


class Ids:
    """Real ids (two registered workers and their tasks), so some generated requests get past
    "not found" into the coordinator's logic instead of all ending in 404."""

    def __init__(self, c: CoordinatorProc, make_sink) -> None:
        headers = {**AUTH, "Connection": "close"}
        self.sink = make_sink()
        with requests.Session() as s:
            s.headers.update(headers)
            self.workers = {role: register_with(s, c, role, self.sink) for role in
                            ("collector", "learner")}
            wait_for(lambda: len(self.sink.tasks()) == 2, what="both tasks pushed")
        self.tasks = [t["task_id"] for t in self.sink.tasks()]

    def apply(self, case, choice: int) -> None:
        """Swap a generated worker or task id for a real one (choice 0: keep it)."""
        if choice == 0:
            return
        worker = list(self.workers.values())[choice % 2]
        task = self.tasks[choice % len(self.tasks)]
        params = case.path_parameters or {}
        if "worker_id" in params:
            params["worker_id"] = worker
        if "task_id" in params:
            params["task_id"] = task
        if isinstance(case.body, dict):
            if isinstance(case.body.get("worker_id"), str):
                case.body["worker_id"] = worker
            if isinstance(case.body.get("task_id"), str):
                case.body["task_id"] = task
            consistent(case.body)


def consistent(body: dict) -> None:
    """Make lists that must agree in length (a rule JSON Schema cannot state, so generated
    bodies rarely meet it) agree, so reports get past validation into the replay."""
    def pair(obj: object, a: str, b: str) -> None:
        if isinstance(obj, dict) and isinstance(obj.get(a), list) and \
                isinstance(obj.get(b), list):
            n = min(len(obj[a]), len(obj[b]))
            obj[a], obj[b] = obj[a][:n], obj[b][:n]

    for chunk in body.get("chunks") or []:
        pair(chunk, "episode_returns", "episode_lengths")
        if isinstance(chunk, dict):
            chunk.pop("segments", None)
            chunk.pop("episode_return_components", None)
    for mode in ("deterministic", "stochastic"):
        pair(body.get(mode), "returns", "lengths")


def register_with(session: requests.Session, c: CoordinatorProc, role: str, sink) -> str:
    resp = session.post(c.api("/workers"), json={"role": role, "url": sink.url},
                        timeout=TIMEOUT)
    assert resp.status_code == 200, resp.text
    return resp.json()["worker_id"]


def bounded(case, sink_url: str) -> None:
    """Keep generated requests local and short: the coordinator pushes tasks to a registered
    worker's `url`, so every URL it would accept points at our fake worker; and long polls
    (`wait_s` up to 30 s, legitimately) are cut to 0.1 s."""
    if not isinstance(case.body, dict):
        return
    url = case.body.get("url")
    if isinstance(url, str) and re.match(r"^https?://", url):
        case.body["url"] = sink_url
    wait = case.body.get("wait_s")
    if isinstance(wait, int | float) and not isinstance(wait, bool) and wait > 0.1:
        case.body["wait_s"] = 0.1


def test_schemathesis_finds_every_answer_documented(
        guarded: CoordinatorProc, task_sink) -> None:
    schema = schemathesis.openapi.from_url(f"{guarded.url}/openapi.json", headers=AUTH,
                                           timeout=TIMEOUT)
    ids = Ids(guarded, task_sink)
    sent = [0]
    session = requests.Session()
    session.headers["Connection"] = "close"
    statuses: Counter[int] = Counter()

    def count(resp: requests.Response, *args, **kwargs) -> None:
        sent[0] += 1
        statuses[resp.status_code] += 1

    session.hooks["response"].append(count)
    failures: list[str] = []
    # Leaving, then run control, last: a worker that left, or a stopped run, answer
    # differently from then on.
    operations = sorted((result.ok() for result in schema.get_all_operations()),
                        key=lambda op: (op.path.startswith(f"{API}/run/"),
                                        op.method.upper() == "DELETE"))
    for op in operations:
        for mode, examples in EXAMPLES.items():
            strategy = op.as_strategy(generation_mode=mode)

            @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
                      phases=[Phase.explicit, Phase.generate, Phase.shrink],
                      suppress_health_check=list(HealthCheck))
            @given(case=strategy, choice=st.integers(0, 3))
            def run(case, choice: int) -> None:
                ids.apply(case, choice)
                bounded(case, ids.sink.url)
                case.call_and_validate(base_url=guarded.url, session=session, headers=AUTH,
                                       checks=CHECKS, timeout=TIMEOUT)

            before, t0 = sent[0], time.monotonic()
            statuses.clear()
            try:
                run()
            except Unsatisfiable:  # negative mode, and nothing can be made invalid
                assert mode is GenerationMode.NEGATIVE, op.label
            except (Exception, BaseExceptionGroup) as err:  # schemathesis' FailureGroup
                failures.append(f"{op.label} ({mode.value}):\n{err}")
            print(f"{op.label} {mode.value}: {sent[0] - before} requests, "
                  f"{time.monotonic() - t0:.1f}s, {dict(sorted(statuses.items()))}")
    session.close()
    assert not failures, f"{len(failures)} operations failed:\n\n" + "\n\n".join(failures)
    assert sent[0] >= MIN_REQUESTS, f"only {sent[0]} requests sent"
    print(f"schemathesis sent {sent[0]} requests to {len(operations)} operations")
    assert guarded.proc.poll() is None, guarded.log()
