"""Learner hooks, as the user writes them: the base class, the context each stage gets, and
their loading from `learner.hooks` (checked at launch by `rlfleet check`). The learner runs
them (`rlfleet.learner.hooks.HookRunner`); docs/hooks.md has a complete example.

A hook is a class named in the config by import path, made once per learner process with its
`params`:

    learner:
      hooks:
        - {path: "my_pkg.hooks:ClipWatcher", priority: 10, params: {every: 100}}

It may define any of these stages; each is called with a `HookContext` (the policy, the
config, the learner's rank, and `metrics`, where a hook's own figures go: they are reported,
averaged over the logging interval and logged under `train/<key>` like the policy's):

- `before_run(ctx)`: once, before the first update (after a checkpoint was restored);
- `before_iter(ctx)`: before each update, with `ctx.batch` the update's batch (tensors);
- `after_iter(ctx)`: after each update, with `ctx.metrics` holding the update's metrics;
  on the updates `logging.batch_log` logs (`ctx.logging_samples`), `ctx.add_log(name,
  values)` logs one value per batch row beside each sample (docs/batch-log.md);
- `after_run(ctx)`: once, after the last update, before the final checkpoint.

Hooks run by `priority` (lowest first), equal priorities in the order listed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rlfleet.shared.contract.config import ConfigError, HookConfig
from rlfleet.shared.util.imports import ImportPathError, load_object

STAGES = ("before_run", "before_iter", "after_iter", "after_run")


class LearnerHook:
    """A base to subclass (optional): every stage does nothing until overridden."""

    def before_run(self, ctx: HookContext) -> None:
        pass

    def before_iter(self, ctx: HookContext) -> None:
        pass

    def after_iter(self, ctx: HookContext) -> None:
        pass

    def after_run(self, ctx: HookContext) -> None:
        pass


@dataclass(eq=False)
class HookContext:
    """What a hook sees. `metrics` is the update's (after_iter) and takes the hook's own."""

    policy: Any
    cfg: Any
    rank: int = 0
    is_publisher: bool = True
    batch: Mapping[str, Any] | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    sample_values: dict[str, Any] = field(default_factory=dict)
    logging_samples: bool = False

    @property
    def train_iterations(self) -> int:
        return int(self.policy.train_iterations)

    def add_log(self, name: str, values: Any) -> None:
        """Log `values` (one per row of `ctx.batch`: a tensor, an array or a list) with the
        update's samples in the batch log, as `name`. Only on updates the batch log logs
        (`logging_samples`); elsewhere, and with no batch log, it does nothing, so a hook
        may call it every update, though it saves work to test `logging_samples` first."""
        if self.logging_samples:
            self.sample_values[name] = values


def load_hooks(configs: list[HookConfig]) -> list[tuple[int, Any]]:
    """The configured hooks, made, with their priorities; a `ConfigError` naming
    `learner.hooks[i]` for one that cannot be imported, made, or has no stage."""
    made: list[tuple[int, Any]] = []
    for i, hc in enumerate(configs):
        what = f"learner.hooks[{i}]"
        try:
            cls = load_object(hc.path, what)
        except ImportPathError as err:
            raise ConfigError(str(err)) from None
        if not isinstance(cls, type):
            raise ConfigError(f"{what}={hc.path!r} is not a class")
        if not any(callable(getattr(cls, stage, None)) for stage in STAGES):
            raise ConfigError(f"{what}={hc.path!r} has none of the stages "
                              f"{', '.join(STAGES)}")
        try:
            hook = cls(**hc.params)
        except TypeError as err:
            raise ConfigError(f"{what}.params: {hc.path} does not take them: {err}") from None
        made.append((hc.priority, hook))
    return made
