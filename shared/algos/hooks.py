"""Learner hooks, as the user writes them: the base class, the context each stage gets, the
stages as small protocols, and their loading from `learner.hooks` (checked at launch by
`rlfleet check`). The learner runs them (`rlfleet.learner.hooks.HookRunner`) at the very
stages where its own features run (publishing, checkpoints, reporting, histograms, the
batch log: they are hooks too). Import the names from `rlfleet` (`from rlfleet import
LearnerHook, HookContext`); docs/extending.md has a complete example.

A hook is a class named in the config by import path, made once per learner process with its
`params`:

    learner:
      hooks:
        - {path: "my_pkg.hooks:ClipWatcher", priority: 10, params: {every: 100}}

It defines any of these stages; each is called with a `HookContext` (the policy, the config,
the learner's rank, and per update its batch, output and `metrics`, where a hook's own
figures go: they are reported, averaged over the logging interval and logged under
`train/<key>` like the policy's):

- `before_run(ctx)`: once, after a checkpoint was restored and the learner group first
  formed (so `ctx.rank` is this learner's), before the first update;
- `on_formed(ctx)`: each time the learner group forms, the first time included (after
  `before_run`): `ctx.rank` and `ctx.is_publisher` may change from one to the next;
- `on_data(ctx)`: new data arrived, before it is learned from; `ctx.moments` holds the
  raw-observation statistics of its chunks (where collectors keep them, `algo.obs_norm`);
- `before_iter(ctx)`: before each update, with `ctx.batch` the update's batch (tensors on
  the learner's device) and `ctx.sampled` its items (buffer and item ids; None for a
  rollout);
- `after_iter(ctx)`: after each update, with `ctx.out` what `learn` returned and
  `ctx.metrics` the update's metrics; on the updates `logging.batch_log` logs
  (`ctx.logging_samples`), `ctx.add_log(name, values)` logs one value per batch row beside
  each sample (docs/batch-log.md);
- `after_round(ctx)`: after the updates on one delivery of data (a sample answer's batches,
  or one rollout);
- `after_run(ctx)`: once, after the last update, before the final version and checkpoint;
  and as the learner dies of an error (`ctx.crashed` is then the error).

Each stage is a protocol (`BeforeRun`, `OnFormed`, `OnData`, `BeforeIter`, `AfterIter`,
`AfterRound`, `AfterRun`): the learner asks `isinstance` once, when it makes the hook, and
calls a hook only at the stages it defines. A hook that keeps state across a restart
defines `state_dict()` and `load_state_dict(state)` (`Stateful`; `LearnerHook` gives both,
keeping nothing): the state (JSON) is saved in every checkpoint and given back when a
learner resumes from one.

Hooks run by `priority` (lowest first), equal priorities in the order listed; the
learner's own run before (negative priorities) and after (large ones) a user's where the
order matters: priorities are taken before user hooks see an update, and the update's
metrics are reported after every hook added to them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from rlfleet.shared.contract.config import HookConfig
from rlfleet.shared.contract.plugins import PluginKind, load_plugin, make_plugin


@dataclass(eq=False)
class HookContext:
    """What a hook sees. `metrics` is the update's (after_iter) and takes the hook's own."""

    policy: Any
    cfg: Any
    rank: int = 0
    is_publisher: bool = True
    batch: Mapping[str, Any] | None = None  # the update's tensors (before_iter, after_iter)
    sampled: Any = None  # the update's items: `Batch.samples`, (buffer, ids, rows) per part
    out: Any = None  # what `learn` returned (after_iter): a `LearnOutput`
    metrics: dict[str, Any] = field(default_factory=dict)
    sample_values: dict[str, Any] = field(default_factory=dict)
    logging_samples: bool = False
    moments: list[dict[str, Any]] = field(default_factory=list)  # on_data
    crashed: BaseException | None = None  # after_run of a learner that is dying of it

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


@runtime_checkable
class BeforeRun(Protocol):
    def before_run(self, ctx: HookContext) -> None:
        """Once, before the first update, the group formed."""


@runtime_checkable
class OnFormed(Protocol):
    def on_formed(self, ctx: HookContext) -> None:
        """Each time the learner group forms."""


@runtime_checkable
class OnData(Protocol):
    def on_data(self, ctx: HookContext) -> None:
        """New data arrived; `ctx.moments` are its chunks' observation statistics."""


@runtime_checkable
class BeforeIter(Protocol):
    def before_iter(self, ctx: HookContext) -> None:
        """Before each update; `ctx.batch` is its batch."""


@runtime_checkable
class AfterIter(Protocol):
    def after_iter(self, ctx: HookContext) -> None:
        """After each update; `ctx.metrics` holds its metrics."""


@runtime_checkable
class AfterRound(Protocol):
    def after_round(self, ctx: HookContext) -> None:
        """After the updates on one delivery of data."""


@runtime_checkable
class AfterRun(Protocol):
    def after_run(self, ctx: HookContext) -> None:
        """Once, after the last update (or as the learner dies: `ctx.crashed`)."""


@runtime_checkable
class Stateful(Protocol):
    """A hook whose state rides in the learner's checkpoints (JSON)."""

    def state_dict(self) -> dict[str, Any]:
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        ...


STAGES: tuple[type, ...] = (BeforeRun, OnFormed, OnData, BeforeIter, AfterIter, AfterRound,
                            AfterRun)


class LearnerHook:
    """A base to subclass (optional): it keeps no state (`state_dict` is empty) and defines
    no stage; a subclass defines the stages it runs at."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None


HOOK = PluginKind("learner hook", any_of=STAGES, subclass="rlfleet.LearnerHook",
                  any_of_label="stages")


def load_hooks(configs: list[HookConfig]) -> list[tuple[int, Any]]:
    """The configured hooks, made, with their priorities; a `ConfigError` naming
    `learner.hooks[i]` for one that cannot be imported, made, or has no stage."""
    made: list[tuple[int, Any]] = []
    for i, hc in enumerate(configs):
        what = f"learner.hooks[{i}]"
        cls = load_plugin(hc.path, what, HOOK)
        made.append((hc.priority, make_plugin(cls, what, **hc.params)))
    return made
