"""Running the learner's hooks (`learner.hooks`, written as `rlfleet.shared.algos.hooks`
describes) at their stages of the training loops.

Each hook is asked once, as the runner is made, which stages it defines (`isinstance`
against the stage protocols); a stage calls only the hooks that define it. A hook that
raises stops the learner like a policy that raises: it is the user's code in the loop, and a
run that silently skipped it would train something else than asked.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from rlfleet.shared.algos.hooks import (
    AfterIter,
    AfterRun,
    BeforeIter,
    BeforeRun,
    HookContext,
    LearnerHook,
    load_hooks,
)
from rlfleet.shared.contract.config import HookConfig

__all__ = ["HookContext", "HookRunner", "LearnerHook"]

Stage = list[Callable[[HookContext], None]]


class HookRunner:
    """The learner's hooks in their order, stage by stage."""

    def __init__(self, hooks: list[tuple[int, Any]], ctx: HookContext) -> None:
        ordered = [hook for _, _, hook in sorted(
            (priority, i, hook) for i, (priority, hook) in enumerate(hooks))]
        self.ctx = ctx
        self.hooks = ordered
        self._before_run: Stage = [h.before_run for h in ordered if isinstance(h, BeforeRun)]
        self._before_iter: Stage = [h.before_iter for h in ordered
                                    if isinstance(h, BeforeIter)]
        self._after_iter: Stage = [h.after_iter for h in ordered if isinstance(h, AfterIter)]
        self._after_run: Stage = [h.after_run for h in ordered if isinstance(h, AfterRun)]
        self.active = bool(self._before_run or self._before_iter or self._after_iter
                           or self._after_run)
        self._iterating = bool(self._before_iter or self._after_iter)

    @classmethod
    def from_config(cls, configs: list[HookConfig], ctx: HookContext) -> HookRunner:
        return cls(load_hooks(configs), ctx)

    @property
    def per_update(self) -> bool:
        """Whether any hook runs around each update (the loops skip both calls if not)."""
        return self._iterating

    def before_run(self) -> None:
        for call in self._before_run:
            call(self.ctx)

    def before_iter(self, batch: Mapping[str, Any]) -> None:
        self.ctx.batch = batch
        for call in self._before_iter:
            call(self.ctx)

    def after_iter(self, metrics: dict[str, Any], sample_values: dict[str, Any] | None = None,
                   logging_samples: bool = False) -> None:
        """`metrics` is the update's and `sample_values` its per-sample values, which hooks
        may add to (the caller reports both); `logging_samples`: the batch log logs this
        update, so `ctx.add_log` keeps what it is given."""
        self.ctx.metrics = metrics
        self.ctx.sample_values = sample_values if sample_values is not None else {}
        self.ctx.logging_samples = logging_samples
        for call in self._after_iter:
            call(self.ctx)
        self.ctx.batch = None
        self.ctx.logging_samples = False

    def after_run(self) -> None:
        for call in self._after_run:
            call(self.ctx)
