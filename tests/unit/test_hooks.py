"""Learner hooks (`rlfleet.shared.algos.hooks`, `rlfleet.learner.hooks`): loading by import
path with errors that name the field, the order of stages among the learner's own operations,
no call at a stage a hook leaves alone, crashes, and hook states."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlfleet.learner.hooks import HookContext, HookRunner
from rlfleet.shared.algos.base import LearnOutput
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


def _runner(*hooks: tuple[float, object]) -> HookRunner:
    runner = HookRunner(HookContext(Policy(), cfg=None))
    for i, (priority, hook) in enumerate(hooks):
        runner.add_user_hook(hook, priority, f"learner.hooks[{i}]")
    return runner


def test_stages_run_by_priority_then_in_order_and_may_add_metrics():
    log: list[str] = []
    runner = _runner((5, Marks(log, "late")), (-1, Marks(log, "early")),
                     (5, Marks(log, "later")))
    runner.before_run()
    runner.before_run()  # once only: a learner group that forms again does not run it again
    out = LearnOutput(metrics={"loss": 1.0})
    runner.after_iter(out)
    assert log == ["early.before_run@7", "late.before_run@7", "later.before_run@7",
                   "early.after_iter", "late.after_iter", "later.after_iter"]
    assert out.metrics == {"loss": 1.0, "early_seen": 1.0, "late_seen": 1.0,
                           "later_seen": 1.0}


def test_a_stage_a_hook_does_not_define_is_not_called():
    class OnlyAtTheEnds(LearnerHook):
        def after_run(self, ctx: HookContext) -> None:
            pass

    runner = _runner((0, OnlyAtTheEnds()))
    assert runner.uses("after_run") and not runner.uses("after_iter")
    assert not runner.uses("before_iter")


def test_the_learners_own_operations_run_around_a_users_by_priority():
    """A built-in feature registers each operation at its own stage and priority (as
    TorchRL's `register_op`): the batch log's flag before every user hook, its take after."""
    log: list[str] = []

    class Flag:
        def register(self, runner: HookRunner) -> None:
            runner.register_op("before_iter", lambda ctx: log.append("flag"), -1000)
            runner.register_op("after_iter", lambda ctx: log.append("take"), 1000)

    class User(LearnerHook):
        def before_iter(self, ctx: HookContext) -> None:
            log.append("user.before")

        def after_iter(self, ctx: HookContext) -> None:
            log.append("user.after")

    runner = _runner((0, User()))
    runner.add(Flag())
    runner.before_iter({"obs": None})
    runner.after_iter(LearnOutput(metrics={}))
    assert log == ["flag", "user.before", "user.after", "take"]


def test_every_stage_reaches_the_hooks_that_define_it_with_its_context():
    seen: list[tuple] = []

    class All(LearnerHook):
        def on_formed(self, ctx: HookContext) -> None:
            seen.append(("on_formed", ctx.rank, ctx.is_publisher))

        def on_data(self, ctx: HookContext) -> None:
            seen.append(("on_data", ctx.moments))

        def after_round(self, ctx: HookContext) -> None:
            seen.append(("after_round",))

        def after_run(self, ctx: HookContext) -> None:
            seen.append(("after_run", ctx.crashed))

    runner = _runner((0, All()))
    runner.on_formed(2, False)
    runner.on_data([{"count": 3}])
    runner.after_round()
    runner.after_run()
    assert seen == [("on_formed", 2, False), ("on_data", [{"count": 3}]), ("after_round",),
                    ("after_run", None)]
    assert runner.ctx.moments == []


def test_after_run_on_a_crash_runs_every_hook_and_names_the_error(caplog):
    seen: list = []

    class Fails(LearnerHook):
        def after_run(self, ctx: HookContext) -> None:
            raise RuntimeError("my bug")

    class Sees(LearnerHook):
        def after_run(self, ctx: HookContext) -> None:
            seen.append(ctx.crashed)

    runner = _runner((0, Fails()), (1, Sees()))
    crash = ValueError("the policy broke")
    runner.after_run(crashed=crash)
    assert seen == [crash] and "my bug" in caplog.text


def test_hook_states_go_into_a_dict_and_come_back_by_name(caplog):
    class Counter(LearnerHook):
        def __init__(self) -> None:
            self.n = 0

        def after_iter(self, ctx: HookContext) -> None:
            self.n += 1

        def state_dict(self) -> dict:
            return {"n": self.n}

        def load_state_dict(self, state: dict) -> None:
            self.n = state["n"]

    first = Counter()
    runner = _runner((0, first), (0, Marks([], "plain")))
    for _ in range(3):
        runner.after_iter(LearnOutput(metrics={}))
    saved = runner.state_dict()
    assert saved == {"learner.hooks[0]": {"n": 3}, "learner.hooks[1]": {}}
    again = Counter()
    _runner((0, again)).load_state_dict({**saved, "learner.hooks[7]": {}})
    assert again.n == 3 and "learner.hooks[7]" in caplog.text


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
