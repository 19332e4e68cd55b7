"""The learner's metrics between reports (`learner/observe/metric_window.py`), the
coordinator's train records made of them (`coordinator/runlog.py`), its alerts
(`coordinator/health.py`) and the learner's data-shortage clock
(`learner/observe/shortage.py`)."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from rlfleet.coordinator.health import RunHealth
from rlfleet.coordinator.membership import Membership
from rlfleet.coordinator.runlog import RunLog
from rlfleet.learner.observe.metric_window import FOLD_AT, MAX_ARRAY_ELEMENTS, MetricWindow
from rlfleet.learner.observe.shortage import DataShortage
from rlfleet.shared.contract.config import ConfigError
from rlfleet.shared.contract.wire.base import Role
from rlfleet.shared.contract.wire.experience import ChunkMeta
from rlfleet.shared.contract.wire.sampling import LearnInfo
from rlfleet.shared.run.config import parse_config
from rlfleet.shared.telemetry.rundata import JSONL_NAME, read_records

from .helpers import make_config


def test_the_window_reports_the_interval_mean_min_max_and_count():
    w = MetricWindow()
    for loss in (1.0, 2.0, 6.0):
        w.add({"loss": torch.tensor(loss), "lr": 0.5})
    report = w.take()
    assert report.stats["loss"].mean == pytest.approx(3.0)
    assert (report.stats["loss"].min, report.stats["loss"].max) == (1.0, 6.0)
    assert report.stats["loss"].count == 3 and report.stats["lr"].mean == 0.5
    assert w.take().stats == {}  # each update goes out once


def test_a_key_may_mix_dtypes_shapes_and_gradients():
    """One stack per key where the values agree; a cast per value where they do not."""
    w = MetricWindow()
    w.add({"loss": torch.tensor(1.0, dtype=torch.float64), "g": torch.tensor(1.0)})
    w.add({"loss": torch.tensor([2.0]), "g": torch.tensor(3.0, requires_grad=True) * 1})
    w.add({"loss": torch.tensor(6.0, dtype=torch.bfloat16), "g": torch.tensor(5.0)})
    stats = w.take().stats
    assert stats["loss"].mean == pytest.approx(3.0) and stats["loss"].count == 3
    assert (stats["g"].mean, stats["g"].min, stats["g"].max) == (3.0, 1.0, 5.0)


def test_values_are_folded_as_they_come_and_still_averaged_exactly():
    w = MetricWindow()
    n = FOLD_AT * 2 + 7
    for i in range(n):
        w.add({"x": torch.tensor(float(i))})
    stats = w.take().stats["x"]
    assert stats.count == n and stats.mean == pytest.approx((n - 1) / 2)
    assert (stats.min, stats.max) == (0.0, n - 1)


def test_nonfinite_values_are_dropped_per_key_counted_and_warned_once(caplog):
    w = MetricWindow()
    caplog.set_level(logging.WARNING, logger="rlfleet.learner")
    for value in (1.0, math.nan, 3.0, math.inf):
        w.add({"loss": torch.tensor(value), "q": torch.tensor(2.0)})
    report = w.take()
    assert report.stats["loss"].mean == 2.0 and report.stats["loss"].count == 2
    assert report.nonfinite == {"loss": 2} and report.stats["q"].count == 4
    w.add({"loss": math.nan})
    report = w.take()
    assert "loss" not in report.stats and report.nonfinite == {"loss": 1}
    assert w.nonfinite_total == 3
    assert caplog.text.count("metric 'loss' was not finite") == 1
    # the report the learner builds from it passes the contract's validation
    info = LearnInfo(worker_id="l", train_iterations=1, policy_version=0,
                     metrics=report.means(), nonfinite=report.nonfinite)
    assert info.nonfinite == {"loss": 1}
    with pytest.raises(ValidationError):  # which a raw NaN would not
        LearnInfo(worker_id="l", train_iterations=1, policy_version=0,
                  metrics={"loss": math.nan})


def test_array_metrics_keep_the_last_array_of_finite_elements():
    w = MetricWindow()
    w.add({"q_per_action": torch.tensor([1.0, 2.0])})
    w.add({"q_per_action": torch.tensor([3.0, math.nan, 5.0]), "hist": [1, 2, 3],
           "one": [4.0]})
    report = w.take()
    assert report.arrays == {"q_per_action": [3.0, 5.0], "hist": [1.0, 2.0, 3.0]}
    assert report.stats["one"].mean == 4.0  # a 1-element list is a scalar here
    assert report.nonfinite == {"q_per_action": 1}
    w.add({"big": torch.zeros(MAX_ARRAY_ELEMENTS + 10)})
    assert len(w.take().arrays["big"]) == MAX_ARRAY_ELEMENTS


def test_a_non_numeric_metric_is_left_out_with_one_warning(caplog):
    w = MetricWindow()
    caplog.set_level(logging.WARNING, logger="rlfleet.learner")
    w.add({"name": "dqn", "loss": 1.0})
    w.add({"name": "dqn"})
    assert set(w.take().stats) == {"loss"}
    assert caplog.text.count("metric 'name' is not numeric") == 1


# -- the coordinator's train records ------------------------------------------------------------

def info(iteration: int, **fields) -> LearnInfo:
    return LearnInfo(worker_id="learner", train_iterations=iteration, policy_version=0,
                     **fields)


def train_records(run_dir: Path) -> list[dict]:
    return [r for r in read_records(run_dir / JSONL_NAME) if r["scope"] == "train"]


def test_a_train_record_is_the_weighted_mean_of_its_interval(tmp_path):
    cfg = parse_config(make_config(logging={"tensorboard": False, "scopes": {
        "train": {"every_env_steps": 100, "min_max": True, "arrays": "minmeanmax"}}}))
    log = RunLog(cfg, tmp_path)
    log.on_learn_info(info(10, metrics={"loss": 1.0}, metric_counts={"loss": 10},
                           metrics_min={"loss": 0.5}, metrics_max={"loss": 2.0}), 100, 5.0)
    log.on_learn_info(info(20, metrics={"loss": 4.0}, metric_counts={"loss": 30},
                           metrics_min={"loss": 3.0}, metrics_max={"loss": 9.0},
                           arrays={"q": [1.0, 3.0]}), 150, 5.0, nonfinite_total=2)
    log.on_learn_info(info(30, metrics={"loss": 5.0}, metric_counts={"loss": 10},
                           arrays={"q": [2.0, 4.0]}), 210, 5.0, nonfinite_total=2)
    log.close()
    first, second = train_records(tmp_path)
    assert first["step"] == 100 and first["train/loss"] == 1.0
    # 150 and 210 together: (4 * 30 + 5 * 10) / 40, the extremes of both, the last array
    assert second["step"] == 210 and second["train/loss"] == pytest.approx(170 / 40)
    assert (second["train/loss_min"], second["train/loss_max"]) == (3.0, 9.0)
    assert (second["train/q_min"], second["train/q_mean"], second["train/q_max"]) == \
        (2.0, 3.0, 4.0)
    assert second["train/nonfinite_metrics"] == 2.0


def test_train_records_every_n_train_iterations(tmp_path):
    cfg = parse_config(make_config(logging={"tensorboard": False, "scopes": {
        "train": {"every_train_iterations": 100}}}))
    log = RunLog(cfg, tmp_path)
    for i, step in zip(range(0, 500, 40), range(1, 1000, 7), strict=False):
        log.on_learn_info(info(i, metrics={"loss": float(i)}), step, 1.0)
    log.close()
    its = [r["train/train_iterations"] for r in train_records(tmp_path)]
    assert its == [0.0, 120.0, 240.0, 360.0, 480.0]
    # the record at 120 is the mean of 40, 80 and 120
    assert train_records(tmp_path)[1]["train/loss"] == pytest.approx(80.0)


def test_closing_writes_what_the_intervals_held_back(tmp_path):
    """A run that stops between two records still shows its last stretch: the train window
    and the episodes since the last record are written when the run log closes."""
    cfg = parse_config(make_config(logging={"tensorboard": False, "scopes": {
        "train": {"every_env_steps": 1000}, "collect": {"every_env_steps": 1000}}}))
    log = RunLog(cfg, tmp_path)
    log.on_learn_info(info(1, metrics={"alpha": 1.0}), 1600, 5.0)
    log.on_learn_info(info(300, metrics={"alpha": 0.5}, metric_counts={"alpha": 299}),
                      2000, 5.0)
    log.on_learn_info(info(600, metrics={"alpha": 0.25}, metric_counts={"alpha": 300}),
                      2240, 5.0)

    def chunk(ret: float) -> ChunkMeta:
        return ChunkMeta(chunk_id="c" * 8, length=64, policy_version=0, segments=[(0, 64)],
                         episode_returns=[ret], episode_lengths=[200])

    log.on_chunks([chunk(-900.0)], 1664, 100.0)
    log.on_chunks([chunk(-300.0)], 2176, 100.0)
    log.on_chunks([chunk(-100.0)], 2240, 100.0)
    log.close()
    first, last = train_records(tmp_path)
    assert (first["step"], first["train/alpha"]) == (1600, 1.0)
    assert last["step"] == 2240 and last["train/train_iterations"] == 600.0
    assert last["train/alpha"] == pytest.approx((0.5 * 299 + 0.25 * 300) / 599)
    collect = [r for r in read_records(tmp_path / JSONL_NAME) if r["scope"] == "collect"]
    assert [(r["step"], r["collect/return_mean"]) for r in collect] == \
        [(1664, -900.0), (2240, -200.0)]
    log.close()  # twice is harmless: nothing is pending, the logger is closed
    assert len(train_records(tmp_path)) == 2


def test_only_the_train_scope_takes_train_iterations_or_min_max():
    with pytest.raises(ConfigError, match="logging.scopes.collect.every_train_iterations"):
        parse_config(make_config(logging={"scopes": {
            "collect": {"every_train_iterations": 10}}}))


# -- alerts -----------------------------------------------------------------------------------

def test_alerts_say_nonfinite_metrics_and_a_starving_learner():
    clock = [0.0]
    members = Membership(10.0, lambda: clock[0])
    health = RunHealth(data_shortage_warn_s=30.0)
    learner, _ = members.register(Role.LEARNER, "http://127.0.0.1:1", "learner")
    assert health.alerts(members) == []
    health.on_learn_info("learner", 40, {"loss": 2})
    health.on_learn_info("learner", 90, {"loss": 1, "q": 1})
    (nan,) = health.alerts(members)
    assert nan.kind == "nonfinite_metrics" and nan.metrics == {"loss": 3, "q": 1}
    assert nan.train_iteration == 40 and "loss (3)" in nan.message
    assert health.nonfinite_total == 4
    members.heartbeat("learner", {"data_wait_s": 31.0})
    kinds = [a.kind for a in health.alerts(members)]
    assert kinds == ["nonfinite_metrics", "data_shortage"]
    assert health.alerts(members, collecting=False)[-1].kind == "nonfinite_metrics"
    members.heartbeat("learner", {"data_wait_s": 0.0})
    assert [a.kind for a in health.alerts(members)] == ["nonfinite_metrics"]


def test_the_shortage_clock_warns_once_per_shortage(caplog):
    now = [0.0]
    shortage = DataShortage(5.0, lambda: now[0])
    caplog.set_level(logging.INFO, logger="rlfleet.learner")
    now[0] = 4.0
    shortage.waiting()
    assert "no data" not in caplog.text
    now[0] = 6.0
    shortage.waiting()
    shortage.waiting()
    assert caplog.text.count("no data for 6 s") == 1 and shortage.seconds() == 6.0
    now[0] = 7.0
    shortage.fed()
    assert "data arrives again after 7 s" in caplog.text and shortage.seconds() == 0.0
    assert shortage.shortages == 1
