"""The learner's half of the batch log (learner/observe/batch_log.py): each part of a batch gets its
own rows' values, values that are not finite travel as null, and a learner that logs more
than its reports carry keeps the newest samples, says so once, and counts what it dropped."""

from __future__ import annotations

import numpy as np
import torch

from rlfleet.learner.observe.batch_log import BatchLogTaker
from rlfleet.shared.batching.batching import Batch
from rlfleet.shared.contract.config import BatchLogConfig
from rlfleet.shared.contract.wire.sampling import MAX_LOGGED_SAMPLES


def test_values_and_ids_stay_aligned_per_part():
    """Two parts in one batch (a mix of buffers): each part's rows get their own values."""
    taker = BatchLogTaker(BatchLogConfig(every_train_iterations=1, samples_per_update=5))
    batch = Batch({"reward": torch.zeros(6)}, samples=[
        ("a", np.array([10, 11, 12]), slice(0, 3)), ("b", np.array([7, 8, 9]), slice(3, 6))])
    taker.take(1, batch, {"v": torch.arange(6.0), "nan": torch.tensor([np.nan] * 6)})
    a, b = taker.take_pending()
    assert (a.buffer, a.item_ids, a.values["v"]) == ("a", [10, 11, 12], [0.0, 1.0, 2.0])
    assert (b.buffer, b.item_ids, b.values["v"]) == ("b", [7, 8], [3.0, 4.0])  # 5 in all
    assert a.values["nan"] == [None] * 3  # JSON has no NaN: not finite is null
    assert taker.take_pending() == []


def test_a_learner_that_logs_more_than_a_report_carries_drops_the_oldest(caplog):
    taker = BatchLogTaker(BatchLogConfig(every_train_iterations=1, samples_per_update=4096))
    batch = Batch({"reward": torch.zeros(4096)},
                  samples=[("a", np.arange(4096), slice(0, 4096))])
    updates = MAX_LOGGED_SAMPLES // 4096 + 3
    for i in range(updates):
        taker.take(i, batch, {"v": torch.zeros(4096)})
    kept = taker.take_pending()
    assert sum(len(e.item_ids) for e in kept) == MAX_LOGGED_SAMPLES
    assert kept[0].train_iteration == 3 and taker.dropped == 3 * 4096  # the oldest went
    assert "the oldest are dropped" in caplog.text
