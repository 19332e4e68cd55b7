"""`logging.histograms` on the learner (`learner/observe/histograms.py`): buckets in TensorBoard's
form, the parameters they cover, and when they are taken."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlfleet.learner.observe.histograms import HistogramTaker, histogram, trainable_parameters
from rlfleet.shared.algos.registry import make_policy
from rlfleet.shared.contract.config import HistogramConfig
from rlfleet.shared.envs.make import run_spec
from rlfleet.shared.run.config import parse_config

from .helpers import make_config


def test_a_histogram_holds_the_finite_values_in_tensorboards_form():
    h = histogram(torch.tensor([0.0, 1.0, 1.0, 3.0, float("nan")]), bins=3)
    assert (h.min, h.max, h.num, h.sum, h.sum_squares) == (0.0, 3.0, 4.0, 5.0, 11.0)
    assert h.bucket_limits == [1.0, 2.0, 3.0] and h.bucket_counts == [1.0, 2.0, 1.0]
    assert histogram(np.array([np.inf]), bins=3) is None


def test_the_taker_covers_trainable_weights_their_gradients_actions_and_q_values():
    cfg = parse_config(make_config())
    policy = make_policy(cfg.algo, run_spec(cfg), seed=0)
    names = set(trainable_parameters(policy))
    assert names and all(n.startswith("q.") for n in names)  # the target network is frozen
    batch = {"obs": torch.randn(32, 4), "action": torch.randint(0, 2, (32,)),
             "reward": torch.ones(32), "next_obs": torch.randn(32, 4),
             "terminated": torch.zeros(32), "truncated": torch.zeros(32)}
    batch = {k: v for k, v in batch.items()}
    policy.learn(batch)
    taker = HistogramTaker(HistogramConfig(every_train_iterations=10, bins=8))
    assert taker.due(policy.train_iterations)
    got = taker.take(policy, batch)
    assert {f"weights/{n}" for n in names} | {f"gradients/{n}" for n in names} | \
        {"actions", "q_values"} == set(got)
    assert got["actions"].num == 32 and got["q_values"].num == 64  # 32 states x 2 actions
    assert not taker.due(policy.train_iterations + 9) and taker.due(policy.train_iterations + 10)
    only = HistogramTaker(HistogramConfig(weights=False, gradients=False, q_values=False))
    assert set(only.take(policy, batch)) == {"actions"}
    assert not HistogramTaker(None).due(0)


def test_a_learn_info_carries_them_validated():
    from rlfleet.shared.contract.wire.sampling import LearnInfo

    h = histogram(np.arange(10.0), bins=4)
    info = LearnInfo(worker_id="l", train_iterations=1, policy_version=0,
                     histograms={"actions": h})
    assert info.histograms["actions"].num == 10
    with pytest.raises(ValueError, match="bucket_limits has 2 entries"):
        LearnInfo.model_validate({"worker_id": "l", "train_iterations": 1,
                                  "policy_version": 0, "histograms": {"x": {
                                      **h.model_dump(), "bucket_limits": [1.0, 2.0]}}})
