"""The coordinator's sample counts (coordinator/batch_log.py) and their reading back
(`load_run(...).samples`): counts add up whatever the memory table's size, items that share a
slot (in one request or across requests) keep their own counts, a cleared buffer's new items
are told apart from its old ones, and both tables stay within `max_mb` on disk."""

from __future__ import annotations

import numpy as np
import pytest

from rlfleet.coordinator.batch_log import BatchLog, _Counts
from rlfleet.shared.contract.config import BatchLogConfig
from rlfleet.shared.contract.wire.sampling import BatchLogEntry, LearnInfo
from rlfleet.shared.telemetry.rotating import table_files
from rlfleet.shared.telemetry.rundata import BATCH_LOG_NAME, SAMPLES_NAME, load_run

pd = pytest.importorskip("pandas", reason="load_run's tables need the tables extra")


def _log(tmp_path, **cfg) -> BatchLog:
    (tmp_path / "metrics.jsonl").write_text("")  # load_run wants the run's metrics file
    return BatchLog(BatchLogConfig(**{"unique_in_memory": 1024, **cfg}), tmp_path)


def _flush(b: BatchLog) -> None:
    b.write_samples(b.take_rows())


def test_counts_add_up_over_a_table_smaller_than_the_items(tmp_path):
    b = _log(tmp_path)
    rng = np.random.default_rng(0)
    truth: dict[int, list[int]] = {}
    for iteration in range(1, 301):  # 300 requests of 256 items from 50,000
        ids = rng.integers(0, 50_000, size=256)
        b.on_sample("replay", ids, iteration)
        for i in ids.tolist():
            truth.setdefault(i, []).append(iteration)
        if iteration % 100 == 0:
            _flush(b)
    _flush(b)
    b.close()
    samples = load_run(tmp_path).samples
    assert samples["item_id"].is_unique and len(samples) == len(truth)
    got = samples.set_index("item_id")
    for i, seen in list(truth.items())[:500]:
        assert got.loc[i, "times_sampled"] == len(seen)
        assert got.loc[i, "first_iteration"] == min(seen)
        assert got.loc[i, "last_iteration"] == max(seen)
    assert int(samples["times_sampled"].sum()) == 300 * 256


def test_items_of_one_request_in_one_slot_keep_their_own_counts():
    counts = _Counts(1024)
    # 5 and 1029 and 2053 share slot 5; 5 twice
    pushed = counts.add(np.array([5, 1029, 5, 2053, 7]), 1)
    rows = [pushed] if pushed is not None else []
    rows.append(counts.take())
    uid, times = (np.concatenate([r[k] for r in rows]) for k in (0, 1))
    got = dict(zip(uid.tolist(), times.tolist(), strict=True))
    assert got == {5: 2, 1029: 1, 2053: 1, 7: 1}
    assert counts.take()[0].size == 0  # taken once


def test_a_cleared_buffer_starts_a_new_generation_of_ids(tmp_path):
    b = _log(tmp_path)
    b.on_sample("replay", np.array([0, 1, 2]), 1)
    b.on_clear("replay")
    b.on_sample("replay", np.array([0, 1]), 2)  # the fresh buffer's first items
    _flush(b)
    b.close()
    samples = load_run(tmp_path).samples
    assert samples[["buffer_clears", "item_id", "times_sampled"]].values.tolist() == [
        [0, 0, 1], [0, 1, 1], [0, 2, 1], [1, 0, 1], [1, 1, 1]]


def test_the_tables_stay_within_max_mb(tmp_path):
    b = _log(tmp_path, max_mb=0.2)
    rng = np.random.default_rng(1)
    for iteration in range(400):
        b.on_sample("replay", rng.integers(0, 10**9, size=512), iteration)
        if iteration % 10 == 0:
            _flush(b)
        b.on_learn_info(LearnInfo(worker_id="l", train_iterations=iteration, policy_version=0,
                                  batch_log=[BatchLogEntry(
                                      train_iteration=iteration, buffer="replay",
                                      item_ids=list(range(256)),
                                      values={"td_error": [0.123456] * 256})]), iteration)
    b.close()
    for name in (SAMPLES_NAME, BATCH_LOG_NAME):
        files = table_files(tmp_path, name)
        assert len(files) > 1  # rotated
        assert sum(f.stat().st_size for f in files) <= 200_000 + 60_000  # one write at most
    assert len(load_run(tmp_path).batch_log) > 0  # the newest rows, read across the parts


def test_without_a_run_dir_nothing_is_kept(tmp_path):
    b = BatchLog(BatchLogConfig(), None)
    assert not b.active
    b.on_sample("replay", np.arange(10), 1)
    assert b.take_rows() == [] and not list(tmp_path.iterdir())


def test_handing_out_only_queues_and_a_backlog_is_counted_at_once(tmp_path):
    """Under the coordinator's lock a sample request is only queued; the scheduler's tick
    counts it. A queue past four tables' worth of items is counted at once (bounded)."""
    b = _log(tmp_path)  # 1024 items a table: a backlog past 4096 items
    b.on_sample("replay", np.arange(1000), 1)
    assert b._queued_items == 1000 and not b._counts  # nothing counted yet
    b.count_queued()
    assert b._queued_items == 0 and "replay" in b._counts
    for _ in range(5):
        b.on_sample("replay", np.arange(1000, 2000), 2)
    assert b._queued_items == 0  # 5,000 > 4,096: counted on the spot
    _flush(b)
    b.close()
    samples = load_run(tmp_path).samples
    assert int(samples["times_sampled"].sum()) == 6000 and len(samples) == 2000
