"""The cluster token and the body limit, against real services in their own processes.

`load_token` is checked on the environment it reads. The guard is checked on a coordinator
started with `RLFLEET_TOKEN`: every route of its Flask url_map but `/health` (enumerated from a
coordinator app built here, so a route added later is covered without editing this file)
refuses a request without the right token with a JSON 401, and nothing changes; the right
token works. A real learner started against that coordinator proves the other direction
(workers' calls, the coordinator's task push) and that its own endpoints are guarded too.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from rlfleet.coordinator.app import create_app
from rlfleet.shared.infra.auth import TOKEN_ENV, TOKEN_FILE_ENV, TokenError, load_token
from rlfleet.shared.infra.webapp import DEFAULT_MAX_BODY, max_body_bytes
from rlfleet.shared.run.config import parse_config

from .helpers import (
    HTTP,
    REPO,
    TIMEOUT,
    CoordinatorProc,
    comparable_status,
    free_port,
    make_config,
    ok,
    register,
    report,
    wait_for,
    wait_running,
    write_chunk,
)

TOKEN = "s3cret-token-for-tests"
WORKER_BODY_LIMIT = 64 * 1024

# -- load_token ------------------------------------------------------------------------------


@pytest.fixture
def no_token_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    monkeypatch.delenv(TOKEN_FILE_ENV, raising=False)
    return monkeypatch


def test_no_token_is_none(no_token_env):
    assert load_token() is None


def test_token_from_the_environment(no_token_env):
    no_token_env.setenv(TOKEN_ENV, f" {TOKEN}\n")
    assert load_token() == TOKEN


def test_token_from_a_file(no_token_env, tmp_path: Path):
    path = tmp_path / "token"
    path.write_text(f"{TOKEN}\n")
    no_token_env.setenv(TOKEN_FILE_ENV, str(path))
    assert load_token() == TOKEN


def test_both_token_settings_are_an_error(no_token_env, tmp_path: Path):
    path = tmp_path / "token"
    path.write_text(TOKEN)
    no_token_env.setenv(TOKEN_ENV, TOKEN)
    no_token_env.setenv(TOKEN_FILE_ENV, str(path))
    with pytest.raises(TokenError, match=f"{TOKEN_ENV}.*{TOKEN_FILE_ENV}"):
        load_token()


@pytest.mark.parametrize("content", ["", "  \n"])
def test_an_empty_token_file_is_an_error_naming_it(no_token_env, tmp_path: Path, content):
    path = tmp_path / "token"
    path.write_text(content)
    no_token_env.setenv(TOKEN_FILE_ENV, str(path))
    with pytest.raises(TokenError, match="empty") as err:
        load_token()
    assert TOKEN_FILE_ENV in str(err.value) and str(path) in str(err.value)


def test_an_unreadable_token_file_is_an_error_naming_it(no_token_env, tmp_path: Path):
    path = tmp_path / "missing"
    no_token_env.setenv(TOKEN_FILE_ENV, str(path))
    with pytest.raises(TokenError) as err:
        load_token()
    assert TOKEN_FILE_ENV in str(err.value) and str(path) in str(err.value)


@pytest.mark.parametrize("value", ["", "two words", "caf\u00e9"])
def test_an_empty_or_unsendable_token_is_an_error(no_token_env, value):
    no_token_env.setenv(TOKEN_ENV, value)
    with pytest.raises(TokenError, match=TOKEN_ENV):
        load_token()


def test_the_cli_reports_a_bad_token_setting_as_a_usage_error(tmp_path: Path):
    env = {**os.environ, TOKEN_FILE_ENV: str(tmp_path / "missing")}
    env.pop(TOKEN_ENV, None)
    out = subprocess.run([sys.executable, "-m", "rlfleet", "status", "--coordinator",
                          f"http://127.0.0.1:{free_port()}"], capture_output=True, text=True,
                         timeout=60, cwd=REPO, env=env)
    assert out.returncode == 2, out.stderr
    assert TOKEN_FILE_ENV in out.stderr and "Traceback" not in out.stderr


def test_body_limit_setting(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("RLFLEET_MAX_BODY_BYTES", raising=False)
    assert max_body_bytes() == DEFAULT_MAX_BODY
    monkeypatch.setenv("RLFLEET_MAX_BODY_BYTES", "2048")
    assert max_body_bytes() == 2048


# -- the coordinator's guard ---------------------------------------------------------------------

def coordinator_routes(tmp_path: Path) -> list[tuple[str, str, list[str]]]:
    """(method, rule, argument names) of every route of a coordinator app built here, but
    `/health` and the dashboard's static files (tested below: they hold no data of the run);
    HEAD and OPTIONS ride along with the GET/POST/DELETE they belong to."""
    app = create_app(parse_config(make_config()), str(tmp_path / "storage"), tmp_path / "run",
                     start=False)
    routes = []
    for rule in app.url_map.iter_rules():
        for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"}):
            if rule.rule != "/health" and not rule.endpoint.startswith("dashboard."):
                routes.append((method, rule.rule, sorted(rule.arguments)))
    app.extensions["rlfleet"].close()
    return routes


def with_token(token: str | None = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


def authed(c: CoordinatorProc, method: str, path: str, body=None) -> requests.Response:
    return HTTP.request(method, c.api(path), json=body, headers=with_token(), timeout=TIMEOUT)




@pytest.fixture(scope="module")
def guarded(coordinator_pool, module_task_sink) -> Iterator[dict]:
    """A coordinator started with RLFLEET_TOKEN, with a collector and a learner registered
    (fake workers) and a chunk reported, so the refused requests below would change
    something if they got through."""
    c = coordinator_pool.take(environ={TOKEN_ENV: TOKEN})
    assert c.token == TOKEN
    col_sink, lrn_sink = module_task_sink(), module_task_sink()
    col = ok(authed(c, "POST", "/workers", {"role": "collector", "url": col_sink.url}))
    lrn = ok(authed(c, "POST", "/workers", {"role": "learner", "url": lrn_sink.url}))
    collect, learn = col_sink.wait_task("collect"), lrn_sink.wait_task("learn")
    cid = write_chunk(c, 64)
    ok(HTTP.post(c.api("/chunks"), headers=with_token(), timeout=TIMEOUT, json={
        "worker_id": col["worker_id"], "task_id": collect["task_id"],
        "chunks": [{"chunk_id": cid, "length": 64, "policy_version": -1}]}))
    try:
        yield {"c": c, "wid": col["worker_id"], "tid": collect["task_id"],
               "lid": lrn["worker_id"], "learn_tid": learn["task_id"]}
    finally:
        coordinator_pool.release(c)


def _path(rule: str, q: dict) -> str:
    values = {"worker_id": q["wid"], "task_id": q["tid"], "name": "replay", "filename": "x"}
    for arg, value in values.items():
        rule = rule.replace(f"<{arg}>", value).replace(f"<path:{arg}>", value)
    assert "<" not in rule, f"test_auth does not know how to fill {rule}: add its argument"
    return rule


def _body(rule: str, q: dict) -> dict:
    """A body the route would act on, had the request been let in."""
    bodies = {
        "/api/v1/workers": {"role": "collector", "url": "http://127.0.0.1:9"},
        "/api/v1/workers/<worker_id>/heartbeat": {"status": {}},
        "/api/v1/tasks/<task_id>/finish": {"worker_id": q["wid"]},
        "/api/v1/tasks/<task_id>/fail": {"worker_id": q["wid"], "error": "boom"},
        "/api/v1/chunks": {"worker_id": q["wid"], "task_id": q["tid"], "chunks": [
            {"chunk_id": "unseen", "length": 5, "policy_version": 0}]},
        "/api/v1/permits/collect": {"worker_id": q["wid"], "wait_s": 0},
        "/api/v1/sample": {"worker_id": q["lid"], "batch_size": 4, "num_batches": 1},
        "/api/v1/learn-info": {"worker_id": q["lid"], "train_iterations": 7,
                               "policy_version": 3},
    }
    return bodies.get(rule, {})


BAD_CREDENTIALS = {
    "no header": {},
    "wrong token": with_token("not-the-token"),
    "token prefix": with_token(TOKEN[:-1]),
    "token and more": with_token(TOKEN + "x"),
    "wrong scheme": {"Authorization": f"Basic {TOKEN}"},
    "scheme only": {"Authorization": "Bearer"},
}


def test_every_route_but_health_refuses_a_missing_or_wrong_token(guarded, tmp_path: Path):
    q, c = guarded, guarded["c"]
    routes = coordinator_routes(tmp_path)
    rules = {rule for _, rule, _ in routes}
    assert {"/metrics", "/api/v1/status", "/api/v1/workers", "/api/v1/chunks"} <= rules
    before = comparable_status(c)
    for method, rule, _ in routes:
        path = _path(rule, q)
        body = _body(rule, q) if method == "POST" else None
        for name, headers in BAD_CREDENTIALS.items():
            r = HTTP.request(method, f"{c.url}{path}", json=body, headers=headers,
                             timeout=TIMEOUT)
            where = f"{method} {path} with {name}"
            assert r.status_code == 401, f"{where}: {r.status_code} {r.text}"
            assert r.headers["Content-Type"].startswith("application/json"), where
            assert r.headers["WWW-Authenticate"] == "Bearer", where
            answer = r.json()
            assert answer["field"] == "Authorization", where
            assert isinstance(answer["error"], str) and answer["error"], where
    # An unknown path is no way around it either (nor a way to probe which paths exist).
    r = HTTP.get(c.api("/no-such-thing"), timeout=TIMEOUT)
    assert r.status_code == 401 and r.json()["field"] == "Authorization"
    assert comparable_status(c) == before


def test_health_is_open_and_the_right_token_works(guarded):
    q, c = guarded, guarded["c"]
    r = HTTP.get(f"{c.url}/health", timeout=TIMEOUT)
    assert r.status_code == 200 and r.json()["ok"] is True
    assert HTTP.head(f"{c.url}/health", timeout=TIMEOUT).status_code == 200
    r = HTTP.get(f"{c.url}/metrics", headers=with_token(), timeout=TIMEOUT)
    assert r.status_code == 200 and "rlfleet_http_requests_total" in r.text
    assert 'status="401"' in r.text  # refused requests are still counted
    assert ok(authed(c, "GET", f"/workers/{q['wid']}"))["state"] == "alive"
    # Lower-case scheme is fine (RFC 7235: the scheme is case-insensitive).
    r = HTTP.get(c.api("/tasks"), headers={"Authorization": f"bearer {TOKEN}"},
                 timeout=TIMEOUT)
    assert r.status_code == 200
    extra = ok(authed(c, "POST", "/workers", {"role": "collector", "url": "http://127.0.0.1:9"}))
    hb = ok(authed(c, "POST", f"/workers/{extra['worker_id']}/heartbeat", {"status": {}}))
    assert hb["stop"] is False
    ok(authed(c, "DELETE", f"/workers/{extra['worker_id']}"))


def test_the_dashboard_page_is_open_but_its_data_is_not(guarded):
    """The page and its scripts load without the token (the page then asks for it); what
    they read, and any path that only looks like a static one, is guarded."""
    c = guarded["c"]
    for path in ("/", "/dashboard/dashboard.js", "/dashboard/dashboard.css",
                 "/dashboard/vendor/uplot/uPlot.iife.min.js",
                 "/dashboard/vendor/uplot/LICENSE"):
        r = HTTP.get(f"{c.url}{path}", timeout=TIMEOUT)
        assert r.status_code == 200, path
        assert "frame-ancestors 'none'" in r.headers["Content-Security-Policy"], path
        assert TOKEN not in r.text
    for method, path in (("POST", "/"), ("GET", "/api/v1/records"), ("GET", "/dashboardx"),
                         ("POST", "/dashboard/dashboard.js")):
        r = HTTP.request(method, f"{c.url}{path}", timeout=TIMEOUT)
        assert r.status_code == 401, f"{method} {path}: {r.status_code}"
    # Paths that climb out of the static directory reach no view but the static one.
    for path in ("/dashboard/../api/v1/status", "/dashboard/%2e%2e/api/v1/status",
                 "/dashboard/..%2fapi/v1/status"):
        r = requests.get(f"{c.url}{path}", timeout=TIMEOUT)
        assert r.status_code in (401, 404) and "counters" not in r.text, path


def test_a_refused_request_is_answered_before_its_body_is_read(guarded):
    """Larger than the 8 MB limit and not JSON: 401 all the same, the body never read."""
    c = guarded["c"]
    r = HTTP.post(c.api("/chunks"), data=b"x" * (DEFAULT_MAX_BODY + 1),
                  headers={"Content-Type": "application/json"}, timeout=TIMEOUT)
    assert r.status_code == 401 and r.json()["field"] == "Authorization"


# -- a real worker against the guarded coordinator -------------------------------------------

@pytest.fixture
def learner(guarded, tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen]]:
    """`rlfleet learner` joined to the guarded coordinator, with the token and a small body
    limit of its own."""
    port = free_port()
    env = {**os.environ, TOKEN_ENV: TOKEN, "RLFLEET_MAX_BODY_BYTES": str(WORKER_BODY_LIMIT)}
    env.pop(TOKEN_FILE_ENV, None)
    env.pop("RLFLEET_COORDINATOR", None)
    log_path = tmp_path / "learner.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rlfleet", "learner", "--coordinator", guarded["c"].url,
             "--port", str(port), "--worker-id", "learner-auth"],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield f"http://127.0.0.1:{port}", proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        assert "-> 401" not in log_path.read_text(errors="replace")


def test_a_worker_joins_a_guarded_coordinator_and_guards_itself(guarded, learner):
    c = guarded["c"]
    url, proc = learner

    def learning() -> dict | None:
        assert proc.poll() is None, f"learner exited with {proc.returncode}"
        tasks = ok(authed(c, "GET", "/tasks"))["tasks"]
        running = [t for t in tasks if t["worker_id"] == "learner-auth"
                   and t["state"] == "running"]
        return running[0] if running else None

    # Registration and heartbeats carry the token; so does the coordinator's task push,
    # which the learner acknowledged (the task is running).
    task = wait_for(learning, timeout_s=90, interval_s=0.2, what="learner-auth's task running")

    r = HTTP.get(f"{url}/health", timeout=TIMEOUT)
    assert r.status_code == 200 and r.json()["role"] == "learner"
    status = ok(HTTP.get(f"{url}/status", headers=with_token(), timeout=TIMEOUT))
    assert status["worker_id"] == "learner-auth" and status["task_id"] == task["task_id"]

    envelope = {"task": {**task, "task_id": "learn-999"}}
    for name, headers in BAD_CREDENTIALS.items():
        for method, path, body in (("GET", "/status", None), ("POST", "/task", envelope)):
            r = HTTP.request(method, f"{url}{path}", json=body, headers=headers,
                             timeout=TIMEOUT)
            where = f"learner {method} {path} with {name}"
            assert r.status_code == 401, f"{where}: {r.status_code} {r.text}"
            assert r.json()["field"] == "Authorization", where
            assert r.headers["WWW-Authenticate"] == "Bearer", where
    # Too large for the worker's limit, with the right token: 413, and nothing accepted.
    r = HTTP.post(f"{url}/task", data=b" " * (WORKER_BODY_LIMIT + 1),
                  headers={**with_token(), "Content-Type": "application/json"},
                  timeout=TIMEOUT)
    assert r.status_code == 413, r.text
    assert r.json() == {"error": f"request body is {WORKER_BODY_LIMIT + 1} bytes; the limit "
                                 f"is {WORKER_BODY_LIMIT}", "field": None}
    after = ok(HTTP.get(f"{url}/status", headers=with_token(), timeout=TIMEOUT))
    assert after["task_id"] == task["task_id"]


# -- 413 -------------------------------------------------------------------------------------

LIMIT = 2048


def test_bodies_over_the_limit_get_413_and_change_nothing(coordinator, task_sink):
    c = coordinator(environ={"RLFLEET_MAX_BODY_BYTES": str(LIMIT)})
    col_sink = task_sink()
    col = register(c, "collector", col_sink)  # small bodies still pass
    collect = col_sink.wait_task("collect")
    wait_running(c, collect["task_id"])  # the task's state settles before the comparison
    cid = write_chunk(c, 32)
    body = (b'{"worker_id": "%s", "task_id": "%s", "chunks": [{"chunk_id": "%s", "length": 32,'
            b' "policy_version": -1}]}' % (col["worker_id"].encode(),
                                            collect["task_id"].encode(), cid.encode()))
    padded = body[:-1] + b" " * (LIMIT * 2) + b"}"
    before = c.status()

    r = HTTP.post(c.api("/chunks"), data=padded, headers={"Content-Type": "application/json"},
                  timeout=TIMEOUT)
    assert r.status_code == 413, r.text
    assert r.headers["Content-Type"].startswith("application/json")
    assert r.json() == {"error": f"request body is {len(padded)} bytes; the limit is {LIMIT}",
                        "field": None}

    def chunked():  # a generator body: requests sends it chunked, without Content-Length
        for i in range(0, len(padded), 1000):
            yield padded[i:i + 1000]

    r = HTTP.post(c.api("/chunks"), data=chunked(),
                  headers={"Content-Type": "application/json"}, timeout=TIMEOUT)
    assert r.request.headers.get("Transfer-Encoding") == "chunked"
    assert "Content-Length" not in r.request.headers
    assert r.status_code == 413, r.text
    assert r.json() == {"error": f"request body is more than {LIMIT} bytes; the limit is "
                                 f"{LIMIT}", "field": None}

    after = c.status()
    for s in (before, after):
        s["run"].pop("wall_seconds")
        s.pop("rates")
        s["workers"] = [{k: v for k, v in w.items() if k != "seconds_since_heartbeat"}
                        for w in s["workers"]]
        s["buffers"] = {name: {k: v for k, v in b.items() if not k.endswith("_per_s")}
                        for name, b in s["buffers"].items()}
        s["metrics"] = {k: v for k, v in s["metrics"].items() if not k.endswith("_per_s")}
    assert after == before
    assert c.status()["counters"]["env_steps"] == 0
    # The same report padded to exactly the limit is accepted, even chunked.
    exact = body[:-1] + b" " * (LIMIT - len(body)) + b"}"
    assert len(exact) == LIMIT
    r = HTTP.post(c.api("/chunks"), data=iter([exact[:1000], exact[1000:]]),
                  headers={"Content-Type": "application/json"}, timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    assert c.status()["counters"]["env_steps"] == 32
    ok(report(c, col["worker_id"], collect["task_id"], [(write_chunk(c, 8), 8)]))
