"""The compose scaler's autoscaling rule (its containers are driven for real, through a Docker
engine, in tests/compose)."""

from __future__ import annotations

from rlfleet.scaler import InsertRateRule


def test_the_rule_adds_one_collector_per_window_while_the_run_is_slow():
    rule = InsertRateRule(min_rate=1000.0, most=3, window_s=30.0)
    assert rule.decide(0.0, rate=200.0, present=1, wanted=1) is None  # the window starts
    assert rule.decide(29.0, rate=200.0, present=1, wanted=1) is None
    assert rule.decide(31.0, rate=200.0, present=1, wanted=1) == 2
    # until the new one is there, nothing more; then a whole new window
    assert rule.decide(32.0, rate=200.0, present=1, wanted=2) is None
    assert rule.decide(40.0, rate=200.0, present=2, wanted=2) is None
    assert rule.decide(69.0, rate=200.0, present=2, wanted=2) is None
    assert rule.decide(71.0, rate=200.0, present=2, wanted=2) == 3
    assert rule.decide(80.0, rate=200.0, present=3, wanted=3) is None
    assert rule.decide(200.0, rate=200.0, present=3, wanted=3) is None  # at most 3


def test_the_rule_leaves_a_fast_enough_run_alone():
    rule = InsertRateRule(min_rate=1000.0, most=8, window_s=10.0)
    for t in range(0, 100, 5):
        assert rule.decide(float(t), rate=1500.0, present=2, wanted=2) is None
