"""learner/feed/rollouts.py against a real coordinator over HTTP: whole chunks from a queue buffer
become rollouts; chunks acted by a policy too many versions old are dropped and counted, and
every chunk handed out, used or dropped, is reported consumed so the queue releases it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlfleet.learner.feed.rollouts import RolloutFeeder, is_stale
from rlfleet.shared.contract.codec import decode_arrays
from rlfleet.shared.contract.wire.base import API
from rlfleet.shared.contract.wire.sampling import LearnInfo, LearnInfoResponse
from rlfleet.shared.infra.http import HttpClient
from rlfleet.shared.infra.storage import DirectoryStorage

from .helpers import (
    buffer_config,
    collector_and_learner,
    ok,
    prewarm_module,
    report,
    write_chunk,
)

FREE = {"min_size": 1}
QUEUE = {"buffers": {"rollouts": buffer_config(kind="queue", capacity=100_000,
                                               rate_limit=FREE)},
         "learner": {"mix": [{"buffer": "rollouts", "fraction": 1.0}]},
         "algo": {"name": "ppo", "max_policy_lag": 2}}
APPO_QUEUE = {**QUEUE, "algo": {"name": "appo"}}  # no max_policy_lag: nothing is stale


@pytest.fixture(scope="module", autouse=True)
def _prewarm(request, coordinator_pool):
    prewarm_module(request, coordinator_pool, {
        "test_stale_chunks_are_dropped_counted_and_released": QUEUE,
        "test_appo_learns_from_chunks_ppo_would_drop": APPO_QUEUE})


@pytest.mark.parametrize("chunk,learner,max_lag,stale", [
    (5, 5, 0, False), (4, 5, 0, True), (3, 5, 2, False), (2, 5, 2, True),
    (-1, 5, None, False), (7, 5, 0, False),   # a chunk newer than the learner is not stale
])
def test_staleness_rule(chunk, learner, max_lag, stale):
    assert is_stale(chunk, learner, max_lag) is stale


def test_stale_chunks_are_dropped_counted_and_released(coordinator, task_sink):
    c = coordinator(**QUEUE)
    col, collect, lrn, _ = collector_and_learner(c, task_sink)
    wid, lid = col["worker_id"], lrn["worker_id"]
    # versions 10, 7 (lag 3: stale at learner version 10), 9, 8, 6 (stale), 10
    versions = [10, 7, 9, 8, 6, 10]
    ids = []
    for v in versions:
        cid = write_chunk(c, 16, version=v)
        ok(report(c, wid, collect["task_id"], [(cid, 16)], policy_version=v))
        ids.append(cid)

    client = HttpClient(c.url, timeout_s=10)
    storage = DirectoryStorage(c.storage_dir)
    feeder = RolloutFeeder(client, storage, lid, "rollouts", rollout_size=64,
                           max_policy_lag=2)
    try:
        rollout = feeder.next(learner_version=10, attempts=3)
        assert rollout is not None
        kept = [cid for cid, v in zip(ids, versions, strict=True) if v >= 8]
        assert rollout.chunk_ids == kept               # oldest first, whole chunks
        assert rollout.rows == 16 * len(kept) == len(rollout.data["reward"])
        # the rollout is the kept chunks' rows, in order
        expected = np.concatenate([decode_arrays(storage.get_chunk(cid))[0]["obs"]
                                   for cid in kept])
        np.testing.assert_array_equal(rollout.data["obs"].numpy(), expected)
        assert rollout.lag_max == 2
        assert rollout.lag_mean == pytest.approx(np.mean([0, 1, 2, 0]))
        assert feeder.dropped_chunks == 2 and feeder.dropped_rows == 32

        # all six were handed out; reporting them consumed releases them (and their files)
        consumed = feeder.take_consumed()
        assert sorted(consumed[0].chunk_ids) == sorted(ids)
        client.post(f"{API}/learn-info", LearnInfo(
            worker_id=lid, train_iterations=4, policy_version=10, consumed=consumed),
            LearnInfoResponse)
        stats = c.status()["buffers"]["rollouts"]
        assert stats["consumed_chunks"] == 6 and stats["in_flight_chunks"] == 0
        assert stats["queued_chunks"] == 0
        assert feeder.take_consumed() == []
    finally:
        client.close()


def test_appo_learns_from_chunks_ppo_would_drop(coordinator, task_sink):
    """The same kind of queue, fed chunks up to 8 versions older than the learner (PPO's
    default drops past 3): APPO's feed, as the on-policy loop builds it from the config,
    drops none, and APPO learns on all of them with their importance weights."""
    from rlfleet.shared.algos.appo import APPO, APPOConfig
    from rlfleet.shared.contract.algo import RolloutSettings
    from rlfleet.shared.contract.spec import EnvSpec

    c = coordinator(**APPO_QUEUE)
    cfg = APPOConfig()
    assert isinstance(cfg, RolloutSettings) and cfg.max_policy_lag is None
    col, collect, lrn, _ = collector_and_learner(c, task_sink)
    versions = [10, 2, 9, 5, 7]
    for v in versions:
        cid = write_chunk(c, 16, version=v)
        ok(report(c, col["worker_id"], collect["task_id"], [(cid, 16)], policy_version=v))
    client = HttpClient(c.url, timeout_s=10)
    feeder = RolloutFeeder(client, DirectoryStorage(c.storage_dir), lrn["worker_id"],
                           "rollouts", rollout_size=80, max_policy_lag=cfg.max_policy_lag)
    try:
        rollout = feeder.next(learner_version=10, attempts=3)
        assert rollout is not None and rollout.rows == 80
        assert rollout.lag_max == 8 > 3 and feeder.dropped_chunks == 0
        data = dict(rollout.data)
        rows = rollout.rows
        cut = np.zeros(rows, bool)
        cut[15::16] = True  # each chunk's rows end a run
        data.update(cut=torch.from_numpy(cut), log_prob=torch.full((rows,), -0.69),
                    value=torch.zeros(rows), bootstrap_value=torch.zeros(rows))
        policy = APPO(APPOConfig(batch_size=40), EnvSpec(obs_shape=(4,), n_actions=2))
        out = policy.learn(data)
        assert policy.train_iterations == 2 and out.metrics["rollout_rows"] == 80.0
        assert 0 < float(out.metrics["importance_weight_mean"]) <= 1.0
    finally:
        client.close()


def test_a_report_that_failed_is_sent_again():
    feeder = RolloutFeeder(None, None, "l", "q", rollout_size=1, max_policy_lag=None)
    feeder.consumed = ["a", "b"]
    first = feeder.take_consumed()
    feeder.consumed = ["c"]
    feeder.give_back(first)  # the learn-info carrying a and b did not arrive
    assert feeder.take_consumed()[0].chunk_ids == ["a", "b", "c"]
