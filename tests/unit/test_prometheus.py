"""The coordinator's Prometheus `/metrics`, scraped from the real service in its own process.

Requests go through its HTTP server (cheroot) as workers send them; the scrape is parsed with
prometheus_client's own parser, so what is checked is what Prometheus would read.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import pytest
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

from .helpers import (
    HTTP,
    TIMEOUT,
    CoordinatorProc,
    buffer_config,
    collector_and_learner,
    ok,
    post,
    prewarm_module,
    register,
    report,
    wait_running,
    write_chunk,
)

DEFAULT: dict = {}
# An evaluation is due after 256 env steps; returns of 475 solve the run.
EARLY_EVAL = {"eval": {"every_env_steps": 256, "episodes": 2, "num_envs": 2,
                       "stop_value": 475}}

BOOTS = {
    "test_requests_are_counted_per_url_template": DEFAULT,
    "test_run_state_follows_workers_chunks_and_learning": DEFAULT,
    "test_evaluation_gauges_and_solving": EARLY_EVAL,
    "test_latency_histogram_is_cumulative_and_bounded": DEFAULT,
}

HEARTBEAT = "/api/v1/workers/<worker_id>/heartbeat"

Samples = dict[tuple[str, frozenset], float]


@pytest.fixture(scope="module", autouse=True)
def _boot_coordinators(request, coordinator_pool):
    prewarm_module(request, coordinator_pool, BOOTS)


def scrape(c: CoordinatorProc) -> Samples:
    """Every sample of one scrape, by (sample name, labels)."""
    resp = HTTP.get(f"{c.url}/metrics", timeout=TIMEOUT)
    assert resp.status_code == 200, resp.text
    assert resp.headers["Content-Type"] == CONTENT_TYPE_LATEST
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(resp.text)
            for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def requests_total(samples: Samples, method: str, endpoint: str, status: int) -> float:
    return value(samples, "rlfleet_http_requests_total", method=method, endpoint=endpoint,
                 status=str(status)) or 0.0


def latency_count(samples: Samples, method: str, endpoint: str) -> float:
    return value(samples, "rlfleet_http_request_duration_seconds_count", method=method,
                 endpoint=endpoint) or 0.0


def test_requests_are_counted_per_url_template(coordinator, task_sink):
    c = coordinator()
    before = scrape(c)
    assert requests_total(before, "POST", HEARTBEAT, 200) == 0

    wid = register(c, "collector", task_sink())["worker_id"]
    ok(post(c, f"/workers/{wid}/heartbeat", {"status": {"env_steps_s": 1.0}}))
    ok(post(c, f"/workers/{wid}/heartbeat"))
    assert post(c, "/workers/nobody/heartbeat").status_code == 404  # a route's own 404
    assert HTTP.get(c.api("/no/such/route"), timeout=TIMEOUT).status_code == 404
    bad = post(c, "/workers", {"role": "juggler", "url": "http://127.0.0.1:1"})
    assert bad.status_code == 400

    after = scrape(c)
    assert requests_total(after, "POST", HEARTBEAT, 200) == 2
    assert requests_total(after, "POST", HEARTBEAT, 404) == 1
    assert latency_count(after, "POST", HEARTBEAT) == 3
    assert requests_total(after, "POST", "/api/v1/workers", 200) == 1
    assert requests_total(after, "POST", "/api/v1/workers", 400) == 1
    assert requests_total(after, "GET", "<unmatched>", 404) == 1
    assert latency_count(after, "GET", "<unmatched>") == 1
    # the first scrape is counted by the second (the request ends after its answer is built)
    assert requests_total(after, "GET", "/metrics", 200) == 1
    # raw paths never become label values
    endpoints = {dict(labels)["endpoint"] for (name, labels) in after
                 if name == "rlfleet_http_requests_total"}
    assert not any(wid in e or "nobody" in e or "/no/such" in e for e in endpoints)
    # latency buckets span half a millisecond to ten seconds, cumulatively
    les = sorted(float(dict(labels)["le"]) for (name, labels) in after
                 if name == "rlfleet_http_request_duration_seconds_bucket"
                 and dict(labels)["endpoint"] == HEARTBEAT)
    assert les[0] == 0.0005 and les[-2] == 10.0 and les[-1] == float("inf")
    assert value(after, "rlfleet_http_request_duration_seconds_bucket", method="POST",
                 endpoint=HEARTBEAT, le="+Inf") == 3


def latency_buckets(samples: Samples, method: str, endpoint: str) -> list[tuple[float, float]]:
    """(upper bound, cumulative count) of one series' buckets, by upper bound."""
    return sorted((float(dict(labels)["le"]), v) for (name, labels), v in samples.items()
                  if name == "rlfleet_http_request_duration_seconds_bucket"
                  and dict(labels)["method"] == method
                  and dict(labels)["endpoint"] == endpoint)


def test_latency_histogram_is_cumulative_and_bounded(coordinator, task_sink):
    """What a soak reads off the histogram (a p99 per interval from bucket differences) holds:
    every series' buckets are cumulative and end in its count, concurrent requests are all
    counted (cheroot answers on a thread pool), and stray paths share one label."""
    c = coordinator()
    wid = register(c, "collector", task_sink())["worker_id"]

    def beat(_: int) -> int:
        return post(c, f"/workers/{wid}/heartbeat").status_code

    with ThreadPoolExecutor(8) as pool:
        assert set(pool.map(beat, range(64))) == {200}
    for i in range(20):  # twenty different raw paths, scanners' style
        resp = HTTP.get(c.api(f"/no/such/{i}/route-{i}"), timeout=TIMEOUT)
        assert resp.status_code == 404

    s = scrape(c)
    assert latency_count(s, "POST", HEARTBEAT) == 64
    assert latency_count(s, "GET", "<unmatched>") == 20
    series = {(dict(labels)["method"], dict(labels)["endpoint"]) for (name, labels) in s
              if name == "rlfleet_http_request_duration_seconds_count"}
    # one series per route template (and `/health`, which the pool asked before lending it)
    assert {e for _, e in series} <= {"/api/v1/workers", HEARTBEAT, "<unmatched>", "/health",
                                      "/metrics"}, series
    assert not any("/no/such" in endpoint for _, endpoint in series)
    for method, endpoint in series:
        buckets = latency_buckets(s, method, endpoint)
        counts = [n for _, n in buckets]
        assert counts == sorted(counts), (method, endpoint, buckets)  # cumulative
        assert buckets[-1][0] == math.inf
        assert buckets[-1][1] == latency_count(s, method, endpoint)
        total = value(s, "rlfleet_http_request_duration_seconds_sum", method=method,
                      endpoint=endpoint)
        assert total is not None and 0 <= total < 10 * counts[-1]

    again = scrape(c)  # a second look only adds: counts never go back
    for method, endpoint in series:
        before = dict(latency_buckets(s, method, endpoint))
        for le, n in latency_buckets(again, method, endpoint):
            assert n >= before.get(le, 0)


def test_run_state_follows_workers_chunks_and_learning(coordinator, task_sink):
    c = coordinator()
    s = scrape(c)
    assert value(s, "rlfleet_workers_alive", role="collector") == 0
    assert value(s, "rlfleet_workers_alive", role="learner") == 0
    assert value(s, "rlfleet_buffer_size", buffer="replay") == 0
    assert value(s, "rlfleet_buffer_chunks") == 0
    assert value(s, "rlfleet_env_steps_total") == 0
    assert value(s, "rlfleet_policy_version") == -1
    assert value(s, "rlfleet_run_solved") == 0 and value(s, "rlfleet_run_stopped") == 0
    assert not [k for k in s if k[0] == "rlfleet_eval_return_mean"]

    col, collect, lrn, _ = collector_and_learner(c, task_sink)
    chunks = [(write_chunk(c, 100), 100), (write_chunk(c, 60), 60)]
    ok(report(c, col["worker_id"], collect["task_id"], chunks,
              episode_returns=[10.0], episode_lengths=[10]))
    ok(post(c, "/learn-info", {"worker_id": lrn["worker_id"], "train_iterations": 5,
                               "policy_version": 3}))

    s = scrape(c)
    assert value(s, "rlfleet_workers_alive", role="collector") == 1
    assert value(s, "rlfleet_workers_alive", role="learner") == 1
    assert value(s, "rlfleet_buffer_size", buffer="replay") == 160
    assert value(s, "rlfleet_buffer_chunks") == 2
    assert value(s, "rlfleet_env_steps_total") == 160
    assert value(s, "rlfleet_chunks_accepted_total") == 2
    assert value(s, "rlfleet_episodes_total") == 2  # one per chunk
    assert value(s, "rlfleet_train_iterations_total") == 5
    assert value(s, "rlfleet_policy_version") == 3
    assert not [k for k in s if k[0] == "rlfleet_eval_return_mean"]

    ok(HTTP.delete(c.api(f"/workers/{col['worker_id']}"), timeout=TIMEOUT))
    s = scrape(c)
    assert value(s, "rlfleet_workers_alive", role="collector") == 0
    assert value(s, "rlfleet_workers_alive", role="learner") == 1


def test_the_ledger_is_exported_by_reason(coordinator, task_sink):
    c = coordinator(buffers={"replay": buffer_config(capacity=100,
                                                     rate_limit={"min_size": 1})})
    col, collect, _, _ = collector_and_learner(c, task_sink)
    for _ in range(4):
        ok(report(c, col["worker_id"], collect["task_id"], [(write_chunk(c, 40), 40)]))
    ledger = c.status()["ledger"]
    s = scrape(c)
    assert ledger["evicted"] == 1  # 160 rows into 100: the first chunk is wholly gone
    assert value(s, "rlfleet_chunks_released_total", reason="evicted") == 1
    assert value(s, "rlfleet_chunks_accepted_total") == ledger["acknowledged"] == 4
    assert value(s, "rlfleet_chunks_orphaned_total") == 0


def test_evaluation_gauges_and_solving(coordinator, task_sink):
    c = coordinator(**EARLY_EVAL)
    col_sink, lrn_sink = task_sink(), task_sink()
    sinks = iter([col_sink, lrn_sink])
    col, collect, lrn, _ = collector_and_learner(c, lambda: next(sinks))
    ok(report(c, col["worker_id"], collect["task_id"], [(write_chunk(c, 256), 256)]))
    ok(post(c, "/learn-info", {"worker_id": lrn["worker_id"], "train_iterations": 1,
                               "policy_version": 0}))
    ev = col_sink.wait_task("evaluate")
    wait_running(c, ev["task_id"])
    assert not [k for k in scrape(c) if k[0] == "rlfleet_eval_return_mean"]

    ok(post(c, "/evaluations", {
        "worker_id": col["worker_id"], "task_id": ev["task_id"], "policy_version": 0,
        "deterministic": {"returns": [500.0, 480.0], "lengths": [500, 480]},
        "stochastic": {"returns": [300.0], "lengths": [300]}}))

    s = scrape(c)
    assert value(s, "rlfleet_eval_return_mean", mode="deterministic") == pytest.approx(490.0)
    assert value(s, "rlfleet_eval_return_mean", mode="stochastic") == pytest.approx(300.0)
    assert value(s, "rlfleet_run_solved") == 1
    assert value(s, "rlfleet_run_stopped") == 1
