"""The record feed behind the dashboard's curves: `GET /api/v1/records?after=<cursor>` answers
only what was written since the cursor, of the scopes asked for; the feed survives a
coordinator restart through metrics.jsonl; bad query parameters get a 400 naming them.

The feed is checked on its own, then through a real coordinator process fed by chunk reports
(whose finished episodes become `collect` records), then through a resumed run logger."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlfleet.coordinator.records import RecordFeed
from rlfleet.coordinator.runlog import RunLog
from rlfleet.shared.contract.config import SCOPES
from rlfleet.shared.contract.wire.records import RecordsQuery
from rlfleet.shared.run.config import parse_config
from rlfleet.shared.telemetry.rundata import JSONL_NAME

from .helpers import (
    HTTP,
    TIMEOUT,
    collector_and_learner,
    get,
    make_config,
    ok,
    report,
    write_chunk,
)


def fill(feed: RecordFeed, n: int, scope: str = "collect", start: int = 0) -> None:
    for i in range(n):
        feed.write(scope, start + i, 0.0, {f"{scope}/x": float(start + i)})


# -- the feed ---------------------------------------------------------------------------------

def test_a_cursor_gets_only_what_was_written_since():
    feed = RecordFeed()
    fill(feed, 3)
    page = feed.since(0)
    assert [r["step"] for r in page["records"]] == [0, 1, 2]
    assert page["next"] == 3 and page["latest"] == 3 and not page["more"]
    assert feed.since(page["next"])["records"] == []
    fill(feed, 2, start=3)
    again = feed.since(page["next"])
    assert [r["step"] for r in again["records"]] == [3, 4]
    assert again["epoch"] == page["epoch"] and again["missed"] == 0


def test_scopes_filter_and_the_cursor_moves_past_the_others():
    feed = RecordFeed()
    fill(feed, 2, "info")
    fill(feed, 2, "eval", start=10)
    fill(feed, 3, "info", start=20)
    page = feed.since(0, ["eval"])
    assert [r["scope"] for r in page["records"]] == ["eval", "eval"]
    assert page["next"] == 7, "the info records after the last eval one are looked at too"
    assert feed.since(page["next"], ["eval"])["records"] == []


def test_limit_pages_the_answer():
    feed = RecordFeed()
    fill(feed, 10)
    first = feed.since(0, limit=4)
    assert [r["seq"] for r in first["records"]] == [1, 2, 3, 4] and first["more"]
    second = feed.since(first["next"], limit=4)
    assert [r["seq"] for r in second["records"]] == [5, 6, 7, 8] and second["more"]
    third = feed.since(second["next"], limit=4)
    assert [r["seq"] for r in third["records"]] == [9, 10] and not third["more"]


def test_a_reader_that_fell_behind_the_capacity_is_told_what_it_missed():
    feed = RecordFeed(capacity=5, history=0)
    fill(feed, 12)
    page = feed.since(2)
    assert [r["seq"] for r in page["records"]] == [8, 9, 10, 11, 12]
    assert page["missed"] == 5  # records 3..7 are gone
    assert feed.since(0)["missed"] == 7
    assert feed.since(12)["missed"] == 0 and feed.since(12)["records"] == []
    # A cursor from another coordinator process, beyond this feed's end: nothing, no error.
    assert feed.since(99) == {**feed.since(12), "next": 12}


def test_older_records_are_thinned_evenly_per_scope_and_memory_stays_flat():
    """Past the whole-kept window each scope keeps every k-th record, k doubling as the run
    grows: a page opened late still gets the whole run, and the feed's size levels off."""
    feed = RecordFeed(capacity=10, history=8)
    fill(feed, 1000, "info")
    fill(feed, 3, "eval", start=5000)  # a rare scope keeps its records whatever the others do
    kept = feed.kept()
    fill(feed, 1000, "info", start=1000)
    assert feed.kept() <= kept + 4, "the feed does not grow with the run"
    page = feed.since(0, limit=10_000)
    seqs = [r["seq"] for r in page["records"]]
    assert seqs == sorted(seqs) and seqs[0] == 1, "the run's first record is kept"
    assert [r["step"] for r in page["records"] if r["scope"] == "eval"] == [5000, 5001, 5002]
    info = [r["step"] for r in page["records"] if r["scope"] == "info"]
    old = info[:-10]  # the thinned part: an even stride
    strides = {b - a for a, b in zip(old, old[1:], strict=False)}
    assert len(strides) == 1 and strides.pop() >= 128
    assert info[-10:] == list(range(1990, 2000)), "the newest records are kept whole"
    assert page["missed"] == 2003 - len(seqs) and not page["more"]
    # the eval scope alone: its three records, the others looked past
    only = feed.since(0, ["eval"])
    assert [r["step"] for r in only["records"]] == [5000, 5001, 5002]
    assert only["next"] == 2003 and not only["more"]


def test_a_limited_page_through_the_thinned_history_goes_on_where_it_stopped():
    feed = RecordFeed(capacity=4, history=4)
    fill(feed, 40)
    everything = [r["seq"] for r in feed.since(0, limit=100)["records"]]
    seen, cursor, missed = [], 0, 0
    while True:
        page = feed.since(cursor, limit=3)
        seen += [r["seq"] for r in page["records"]]
        missed += page["missed"]
        cursor = page["next"]
        if not page["more"]:
            break
    assert seen == everything and missed == 40 - len(everything)


def test_each_feed_has_its_own_epoch():
    assert RecordFeed().epoch != RecordFeed().epoch


def test_the_query_pattern_knows_every_logging_scope():
    for scope in SCOPES:
        assert RecordsQuery(scope=scope).scopes() == [scope]
    assert RecordsQuery(scope=",".join(SCOPES)).scopes() == list(SCOPES)
    for bad in ("", "evals", "eval,", "eval;info", "EVAL"):
        with pytest.raises(ValueError):
            RecordsQuery(scope=bad)


# -- through a resumed run logger ---------------------------------------------------------------

def test_a_resumed_run_feeds_the_records_it_kept(tmp_path: Path):
    """After a restart the feed starts from metrics.jsonl cut back to the snapshot: the page
    redraws the same curve, without the records the crash made obsolete."""
    cfg = parse_config(make_config(logging={"tensorboard": False,
                                            "scopes": {"info": {"every_env_steps": 1}}}))
    first = RunLog(cfg, tmp_path, resume_step=None)
    for step in (100, 200, 300):
        first.on_tick(step, {"counters/env_steps": float(step)})
    first.close()
    with (tmp_path / JSONL_NAME).open("a") as f:
        f.write('{"scope": "info", "st')  # a line a SIGKILL cut short
    resumed = RunLog(cfg, tmp_path, resume_step=200)
    page = resumed.feed.since(0)
    assert [(r["scope"], r["step"]) for r in page["records"]] == [("info", 100), ("info", 200)]
    assert page["records"][0]["values"] == {"counters/env_steps": 100.0}
    resumed.on_tick(1000, {"counters/env_steps": 1000.0})
    after = resumed.feed.since(page["next"])
    assert [r["step"] for r in after["records"]] == [1000]
    assert after["epoch"] != first.feed.epoch
    resumed.close()


# -- over HTTP ----------------------------------------------------------------------------------

FEED_CONFIG = {"logging": {"tensorboard": False,
                           "scopes": {"collect": {"every_env_steps": 1}}}}


@pytest.fixture
def fed(coordinator, task_sink):
    c = coordinator(**FEED_CONFIG)
    col, collect, _, _ = collector_and_learner(c, task_sink)

    def episodes(returns: list[float]) -> None:
        cid = write_chunk(c, 64)
        ok(report(c, col["worker_id"], collect["task_id"], [(cid, 64)],
                  episode_returns=returns, episode_lengths=[10] * len(returns)))

    return c, episodes


def records(c, **params) -> dict:
    r = HTTP.get(c.api("/records"), params=params, timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    return r.json()


def test_the_endpoint_answers_only_records_not_sent_yet(fed):
    c, episodes = fed
    episodes([10.0, 20.0])
    page = records(c, scope="collect")
    collect = [r for r in page["records"] if r["scope"] == "collect"]
    assert len(collect) == 1 and collect[0]["values"]["collect/return_mean"] == 15.0
    assert records(c, scope="collect", after=page["next"])["records"] == []
    episodes([30.0])
    new = records(c, scope="collect", after=page["next"])
    assert [r["values"]["collect/return_mean"] for r in new["records"]] == [30.0]
    assert new["epoch"] == page["epoch"] and new["next"] > page["next"]
    assert get(c, "/status")["counters"]["episodes"] == 3
    # The same records as metrics.jsonl holds, in the same order.
    on_disk = [json.loads(line) for line in (c.run_dir / JSONL_NAME).read_text().splitlines()]
    assert [r["step"] for r in on_disk if r["scope"] == "collect"] == \
        [r["step"] for r in records(c, scope="collect")["records"]]


@pytest.mark.parametrize("params, field", [
    ({"after": "-1"}, "after"), ({"after": "soon"}, "after"), ({"limit": "0"}, "limit"),
    ({"limit": "5001"}, "limit"), ({"scope": "evals"}, "scope"), ({"afer": "3"}, "afer"),
    ({"after": ["1", "2"]}, "after"),
])
def test_bad_parameters_get_a_400_naming_them(module_coordinator, params, field):
    r = HTTP.get(module_coordinator.api("/records"), params=params, timeout=TIMEOUT)
    assert r.status_code == 400, r.text
    assert r.json()["field"] == field

