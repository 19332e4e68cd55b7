"""How collectors keep pace with the learner: a lopsided rate-limit band (`min_lead`) keeps
the learner at the top of the band, as the single-process runner's is; the adder's throttle
follows every answer of the coordinator (set and lifted), and while it is set the reporter
sends at once, so a collector's chunks do not outrun the answers that would stop it; and the
coordinator logs the policy lag of the chunks it accepts (`collect/policy_lag`).

A real coordinator process, real storage (a directory) and the real adder; the learner is
played by direct `/sample` requests.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from rlfleet.collector.adder import StorageAdder
from rlfleet.coordinator.runlog import RunLog
from rlfleet.shared.contract.wire.experience import ChunkMeta
from rlfleet.shared.infra.http import HttpClient
from rlfleet.shared.infra.storage import DirectoryStorage
from rlfleet.shared.run.config import parse_config

from .helpers import (
    buffer_config,
    collector_and_learner,
    make_config,
    ok,
    post,
    prewarm_module,
)

# Batches of 8 items, 8 items sampled per item inserted from the first item on; the learner
# may run 80 items ahead of that line, and collectors wait while it is less than 40 ahead.
LOPSIDED = {"algo": {"batch_size": 8}, "buffers": {"replay": buffer_config(
    rate_limit={"min_size": 1, "samples_per_insert": 8, "error_buffer": 80, "min_lead": 40})}}

BOOTS = {"test_the_throttle_follows_every_answer_in_a_lopsided_band": LOPSIDED,
         "test_while_throttled_the_reporter_sends_at_once": LOPSIDED}


@pytest.fixture(scope="module", autouse=True)
def _prewarm(request, coordinator_pool):
    prewarm_module(request, coordinator_pool, BOOTS)


def _arrays(n: int) -> dict[str, np.ndarray]:
    return {"obs": np.zeros((n, 4), np.float32), "action": np.zeros(n, np.int64),
            "reward": np.ones(n, np.float32), "next_obs": np.zeros((n, 4), np.float32),
            "terminated": np.zeros(n, bool), "truncated": np.zeros(n, bool)}


def _adder(c, tmp_path: Path, worker_id: str, task_id: str, report_interval_s: float
           ) -> tuple[StorageAdder, HttpClient]:
    client = HttpClient(c.url, timeout_s=5, retries=2)
    adder = StorageAdder(DirectoryStorage(tmp_path / "storage"), client, lambda: worker_id,
                         lambda: task_id, report_interval_s=report_interval_s)
    return adder, client


def _sample_all(c, learner_id: str) -> int:
    got = ok(post(c, "/sample", {"worker_id": learner_id, "batch_size": 8,
                                 "num_batches": 1000}))
    return got["num_batches"]


def test_the_throttle_follows_every_answer_in_a_lopsided_band(coordinator, task_sink,
                                                              tmp_path: Path):
    c = coordinator(**LOPSIDED)
    col, collect, lrn, _ = collector_and_learner(c, task_sink)
    adder, client = _adder(c, tmp_path, col["worker_id"], collect["task_id"], 0.02)
    try:
        # 16 items: the line is at 120 sampled items and the learner has sampled none
        adder.add(_arrays(16), -1, [], [])
        assert adder.flush(timeout=5)
        assert adder.throttle.is_set()
        # the learner samples to the top of the band: 120 + 80 items, 25 batches of 8
        assert _sample_all(c, lrn["worker_id"]) == 25
        permit = ok(post(c, "/permits/collect", {"worker_id": col["worker_id"],
                                                  "wait_s": 0.1}))
        assert permit == {"granted": True, "stop": False}
        # a permit does not lift the throttle: the answer to the next chunk does. One more
        # item moves the line to 128: the learner is 72 items ahead, more than 40.
        assert adder.throttle.is_set()
        adder.add(_arrays(1), -1, [], [])
        assert adder.flush(timeout=5)
        assert not adder.throttle.is_set()
        # 4 more items: the line is at 160, the learner just 40 ahead with its 200 items...
        adder.add(_arrays(4), -1, [], [])
        assert adder.flush(timeout=5)
        assert not adder.throttle.is_set()
        # ... and one more puts it 32 ahead, less than 40: the answer sets the throttle
        adder.add(_arrays(1), -1, [], [])
        assert adder.flush(timeout=5)
        assert adder.throttle.is_set()
        status = c.status()["buffers"]["replay"]
        assert status["inserted_items"] == 22 and status["sampled_items"] == 200
    finally:
        adder.close(timeout=2)
        client.close()


def test_while_throttled_the_reporter_sends_at_once(coordinator, task_sink, tmp_path: Path):
    """With a report interval far longer than the test's deadline, a throttled collector's
    chunk still reaches the coordinator: the reporter does not gather while the collector
    waits for its answer."""
    c = coordinator(**LOPSIDED)
    col, collect, lrn, _ = collector_and_learner(c, task_sink)
    adder, client = _adder(c, tmp_path, col["worker_id"], collect["task_id"], 60.0)
    try:
        adder.throttle.set()  # as after an earlier answer
        adder.add(_arrays(16), -1, [], [])
        assert adder.flush(timeout=10), "the chunk waited for the report interval"
        assert c.status()["counters"]["chunks_accepted"] == 1
        assert adder.throttle.is_set()  # the learner has sampled nothing yet
    finally:
        adder.close(timeout=2)
        client.close()


def test_the_policy_lag_of_accepted_chunks_is_logged(tmp_path: Path):
    cfg = parse_config(make_config(logging={"scopes": {"collect": {"every_env_steps": 0}}}))
    runlog = RunLog(cfg, tmp_path, None)
    try:
        def meta(version: int) -> ChunkMeta:
            return ChunkMeta(chunk_id=f"c{version}", length=8, policy_version=version,
                             episode_returns=[1.0], episode_lengths=[8])

        # learner at version 5: chunks acted by versions 3 and 5 are 2 and 0 behind; a chunk
        # acted before any version was published (-1) has no lag to count
        runlog.on_chunks([meta(3), meta(5), meta(-1)], 24, 0.0, policy_version=5)
        runlog.on_chunks([meta(7)], 32, 0.0, policy_version=8)
    finally:
        runlog.close()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text()
               .splitlines()]
    lags = [r["collect/policy_lag"] for r in records if r["scope"] == "collect"]
    assert lags == [1.0, 1.0]
