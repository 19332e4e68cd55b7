"""Learner hooks (`rlfleet.shared.algos.hooks`, `rlfleet.learner.hooks`): loading by import
path with errors that name the field, the order of stages, and no per-update calls for stages
a hook leaves alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlfleet.learner.hooks import HookContext, HookRunner
from rlfleet.shared.algos.hooks import LearnerHook, load_hooks
from rlfleet.shared.contract.config import ConfigError, HookConfig

USERLAND = Path(__file__).resolve().parents[1] / "userland"


class Policy:
    train_iterations = 7


class Marks(LearnerHook):
    def __init__(self, log: list, name: str) -> None:
        self.log, self.name = log, name

    def before_run(self, ctx: HookContext) -> None:
        self.log.append(f"{self.name}.before_run@{ctx.train_iterations}")

    def after_iter(self, ctx: HookContext) -> None:
        self.log.append(f"{self.name}.after_iter")
        ctx.metrics[f"{self.name}_seen"] = 1.0


def test_stages_run_by_priority_then_in_order_and_may_add_metrics():
    log: list[str] = []
    hooks = [(5, Marks(log, "late")), (-1, Marks(log, "early")), (5, Marks(log, "later"))]
    runner = HookRunner(hooks, HookContext(Policy(), cfg=None))
    runner.before_run()
    metrics: dict = {"loss": 1.0}
    runner.after_iter(metrics)
    assert log == ["early.before_run@7", "late.before_run@7", "later.before_run@7",
                   "early.after_iter", "late.after_iter", "later.after_iter"]
    assert metrics == {"loss": 1.0, "early_seen": 1.0, "late_seen": 1.0, "later_seen": 1.0}
    assert runner.per_update  # after_iter is overridden


def test_stages_left_as_the_base_no_op_cost_nothing_per_update():
    class OnlyAtTheEnds(LearnerHook):
        def after_run(self, ctx: HookContext) -> None:
            pass

    runner = HookRunner([(0, OnlyAtTheEnds())], HookContext(Policy(), cfg=None))
    assert runner.active and not runner.per_update
    assert not HookRunner([], HookContext(Policy(), cfg=None)).active


@pytest.mark.parametrize("path,params,message", [
    ("my_rl:NoSuchHook", {}, r"learner.hooks\[0\]='my_rl:NoSuchHook': module 'my_rl' has no "
     "attribute"),
    ("my_rl:NOT_A_POLICY", {},
     r"learner.hooks\[0\]='my_rl:NOT_A_POLICY' is not a learner hook class"),
    ("my_rl:LineWalk", {}, "has none of the stages"),
    ("my_rl:CountingHook", {"colour": "red"}, r"learner.hooks\[0\].params"),
])
def test_a_hook_that_cannot_be_made_is_a_config_error_naming_it(monkeypatch, path, params,
                                                                  message):
    monkeypatch.syspath_prepend(str(USERLAND))
    with pytest.raises(ConfigError, match=message):
        load_hooks([HookConfig(path=path, params=params)])


def test_a_plain_path_is_a_hook_of_priority_0():
    assert HookConfig.model_validate("my_rl:FirstHook") == HookConfig(path="my_rl:FirstHook")
    with pytest.raises(ValueError):
        HookConfig.model_validate("not a path")
