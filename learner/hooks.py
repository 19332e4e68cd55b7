"""The learner's hook host: the stages of its training loops, where its own features
(publishing, checkpoints, reporting, histograms, the batch log, the dataset scores, the
observation statistics, priorities) and the user's hooks (`learner.hooks`, written as
`rlfleet.shared.algos.hooks` describes) run alike.

As in TorchRL's trainer, a feature registers its operations at named stages with a
priority (`register_op`) and its state under a name (`register_state`); the loops only call
the stages. A user's hook is asked once, when it is added, which stages it defines
(`isinstance` against the stage protocols) and whether it keeps state; a stage calls only
the operations registered at it, so a stage nobody uses costs a loop one empty iteration.

A hook that raises stops the learner like a policy that raises: it is the user's code in the
loop, and a run that silently skipped it would train something else than asked.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Literal, Protocol

from rlfleet.shared.algos.base import LearnOutput
from rlfleet.shared.algos.hooks import (
    AfterIter,
    AfterRound,
    AfterRun,
    BeforeIter,
    BeforeRun,
    HookContext,
    LearnerHook,
    OnData,
    OnFormed,
    Stateful,
    load_hooks,
)
from rlfleet.shared.contract.config import HookConfig

__all__ = ["BuiltInHook", "HookContext", "HookRunner", "LearnerHook", "Stage"]

log = logging.getLogger("rlfleet.learner")

Stage = Literal["before_run", "on_formed", "on_data", "before_iter", "after_iter",
                "after_round", "after_run"]
STAGE_NAMES: tuple[Stage, ...] = ("before_run", "on_formed", "on_data", "before_iter",
                                  "after_iter", "after_round", "after_run")
Op = Callable[[HookContext], None]


class Order:
    """Where the learner's own operations run among a user's hooks (priority 0 unless the
    config sets one): what prepares an update before them, what reads what they added (a
    metric, a logged value) after them."""

    OBS_STATS = -1000.0  # on_data: the statistics are merged before anyone uses the data
    BATCH_LOG_FLAG = -1000.0  # before_iter: hooks see whether this update is logged
    PRIORITIES = 1000.0  # after_iter: the update's new priorities, for the next report
    HISTOGRAMS = 1100.0  # after_iter: gradients and weights of the update just made
    BATCH_LOG = 1200.0  # after_iter: after every hook's `add_log`
    DATASET_SCORES = 1300.0  # after_iter: the policy on a held-out dataset
    PUBLISH = 1400.0  # after_iter, on_formed, after_run: a policy version
    REPORT = 1500.0  # after_iter, after_round: after every hook added its metrics
    CHECKPOINT = 1450.0  # after_round, after_run: after the version, before the report


class BuiltInHook(Protocol):
    """One of the learner's own features: it registers its operations and its state."""

    def register(self, runner: HookRunner) -> None:
        ...


class HookRunner:
    """Operations by stage, in priority order (equal priorities in the order registered),
    and the states of the hooks that keep one."""

    def __init__(self, ctx: HookContext) -> None:
        self.ctx = ctx
        self._ops: dict[Stage, list[tuple[float, int, Op]]] = {s: [] for s in STAGE_NAMES}
        self._calls: dict[Stage, list[Op]] = {s: [] for s in STAGE_NAMES}
        self._states: dict[str, Stateful] = {}
        self._count = 0
        self._ran = False  # before_run, once

    # -- registering --------------------------------------------------------------------------

    def register_op(self, stage: Stage, op: Op, priority: float = 0.0) -> None:
        self._count += 1
        self._ops[stage].append((priority, self._count, op))
        self._ops[stage].sort(key=lambda entry: entry[:2])
        self._calls[stage] = [entry[2] for entry in self._ops[stage]]

    def register_state(self, name: str, hook: Stateful) -> None:
        """`hook`'s state rides in checkpoints under `name`."""
        if name in self._states:
            raise ValueError(f"two learner hooks keep their state as {name!r}")
        self._states[name] = hook

    def add(self, *hooks: BuiltInHook) -> HookRunner:
        for hook in hooks:
            hook.register(self)
        return self

    def add_user_hook(self, hook: Any, priority: float, name: str) -> None:
        """A user's hook, at every stage it defines, its state (if it keeps one) as
        `name`."""
        stages: list[tuple[Stage, Op]] = []
        if isinstance(hook, BeforeRun):
            stages.append(("before_run", hook.before_run))
        if isinstance(hook, OnFormed):
            stages.append(("on_formed", hook.on_formed))
        if isinstance(hook, OnData):
            stages.append(("on_data", hook.on_data))
        if isinstance(hook, BeforeIter):
            stages.append(("before_iter", hook.before_iter))
        if isinstance(hook, AfterIter):
            stages.append(("after_iter", hook.after_iter))
        if isinstance(hook, AfterRound):
            stages.append(("after_round", hook.after_round))
        if isinstance(hook, AfterRun):
            stages.append(("after_run", hook.after_run))
        for stage, op in stages:
            self.register_op(stage, op, priority)
        if isinstance(hook, Stateful):
            self.register_state(name, hook)

    def add_user_hooks(self, configs: list[HookConfig]) -> HookRunner:
        """`learner.hooks`, made (a `ConfigError` naming the one that cannot be)."""
        for i, (priority, hook) in enumerate(load_hooks(configs)):
            self.add_user_hook(hook, priority, f"learner.hooks[{i}]")
        return self

    def uses(self, stage: Stage) -> bool:
        return bool(self._calls[stage])

    # -- the stages ---------------------------------------------------------------------------

    def _call(self, stage: Stage) -> None:
        ctx = self.ctx
        for op in self._calls[stage]:
            op(ctx)

    def before_run(self) -> None:
        """Once: a learner that forms its group again does not run it again."""
        if not self._ran:
            self._ran = True
            self._call("before_run")

    def on_formed(self, rank: int, is_publisher: bool) -> None:
        """The learner group formed, this learner at `rank`: `before_run` the first time
        (so it sees the rank too), then `on_formed`."""
        self.ctx.rank, self.ctx.is_publisher = rank, is_publisher
        self.before_run()
        self._call("on_formed")

    def on_data(self, moments: list[dict[str, Any]]) -> None:
        self.ctx.moments = moments
        self._call("on_data")
        self.ctx.moments = []

    def before_iter(self, batch: Mapping[str, Any], sampled: Any = None) -> None:
        ctx = self.ctx
        ctx.batch, ctx.sampled = batch, sampled
        self._call("before_iter")

    def after_iter(self, out: LearnOutput) -> None:
        """`out` is the update's: hooks may add to its metrics and per-sample values (the
        reporting hook reports both); the update's context is cleared after."""
        ctx = self.ctx
        ctx.out, ctx.metrics = out, out.metrics
        ctx.sample_values = out.sample_values if out.sample_values is not None else {}
        self._call("after_iter")
        ctx.batch = ctx.sampled = ctx.out = None
        ctx.metrics, ctx.sample_values = {}, {}
        ctx.logging_samples = False

    def after_round(self) -> None:
        self._call("after_round")

    def after_run(self, crashed: BaseException | None = None) -> None:
        """The run is over, or the learner is dying of `crashed`: then every operation runs
        even if one before it fails (each failure is logged; the crash is what is
        raised)."""
        self.ctx.crashed = crashed
        if crashed is None:
            self._call("after_run")
            return
        for op in self._calls["after_run"]:
            try:
                op(self.ctx)
            except Exception:  # the original error is the one to report
                log.exception("a hook failed in after_run on the way down")

    # -- state --------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, dict[str, Any]]:
        return {name: hook.state_dict() for name, hook in self._states.items()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Give each hook its saved state; a hook with none saved (new since the checkpoint)
        keeps its own, and a saved state nobody claims is logged."""
        for name, saved in state.items():
            hook = self._states.get(name)
            if hook is None:
                log.warning("a checkpoint holds the state of learner hook %s, which this run "
                            "does not have: ignored", name)
                continue
            hook.load_state_dict(saved)
