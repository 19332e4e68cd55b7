"""The run's commander: who chooses the env settings of each task (`coordinator.commander`).

A commander is user code the coordinator loads by import path and makes once, with the
run's config. It decides what the envs of each task look like (keyword arguments on top of
`env.kwargs`, and the level seeds a collector's envs replay) and sees every evaluation, so
a curriculum, prioritised level replay or an env swap runs inside one run:

    coordinator:
      commander: my_pkg.curricula:Grow

    class Grow(BaseCommander):
        def __init__(self, cfg):
            super().__init__(cfg)
            self.length = 4
        def collect_settings(self, worker_id, task_seed):
            return TaskEnvSettings(env_kwargs={"length": self.length})
        def on_evaluation(self, result, env_kwargs):
            if env_kwargs == {"length": self.length} and (result.success_rate or 0) >= 0.9:
                self.length *= 2
        def solved(self):
            return "solved: length 64 walked" if self.length > 64 else None

Who calls what, all on the coordinator, one call at a time (the coordinator serialises them):

- `collect_settings(worker_id, task_seed)` when a collect task is made or handed to another
  collector, and again for every live collect task after each `on_evaluation`: a task
  whose settings changed is pushed to its collector again (same task id), and the
  collector rebuilds its envs between chunks.
- `evaluate_settings()` when an evaluation is made: the env keyword arguments it runs with.
- `on_evaluation(result, env_kwargs)` with every evaluation result and the env keyword
  arguments that evaluation ran with (an evaluation made before the commander moved on
  ran the old settings).
- `solved()` after each `on_evaluation`: a reason to end the run as solved, or None
  (`eval.stop_value` still applies to every evaluation, whatever its level: a curriculum
  usually leaves it unset and solves the run here).
- `scalars()` on every scheduler tick: logged as `commander/<key>` in the `info` scope.
- `score(result, env_kwargs)` with every evaluation, before `on_evaluation`: how it ranks
  for the run's best policy (`best_policy.safetensors`, what `play`, `serve-policy` and
  `export` use), higher is better, None for one that must not count. By default its mean
  return; a curriculum ranks its harder levels first, so the best policy is not the one
  that walked the easiest corridor best.
- `state_dict()` when the coordinator snapshots the run, and `load_state_dict(state)` once
  when a resumed run restores that snapshot, before anything else is asked: a curriculum
  resumes at the level it had reached. The state must be JSON (dicts, lists, strings,
  numbers, booleans, None). Both are optional: a commander without them starts afresh on
  resume (its tasks keep their last settings until it is asked again).

The five methods every commander has are the `Commander` protocol; the optional ones are
`ScoresEvaluations` (`score`) and `KeepsState` (`state_dict`, `load_state_dict`), asked with
`isinstance` once, when the coordinator makes the commander. `BaseCommander` (exported as
`rlfleet.BaseCommander`) gives every method a default, so a subclass writes only what it
changes. An exception in a commander's method stops the run with the error as its reason.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from rlfleet.shared.contract.plugins import PluginKind, load_plugin, make_plugin
from rlfleet.shared.contract.wire.base import EnvKwargs, LevelSeeds
from rlfleet.shared.contract.wire.evaluation import EvaluationResult

FIELD = "coordinator.commander"


class TaskEnvSettings(BaseModel):
    """The env settings of one collect task, validated as the task's wire fields are."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    env_kwargs: EnvKwargs = Field(default_factory=dict, description="keyword arguments on "
                                  "top of `env.kwargs` (JSON scalars)")
    level_seeds: LevelSeeds = Field(None, description="env i resets with "
                                    "`level_seeds[i % len]` at every episode; None: the "
                                    "envs' own seeding")


@runtime_checkable
class Commander(Protocol):
    """What the coordinator calls; `BaseCommander` implements all of it."""

    def collect_settings(self, worker_id: str, task_seed: int) -> TaskEnvSettings:
        """The env settings of the collect task of `worker_id` (`task_seed`: its seed); a
        mapping of `TaskEnvSettings`'s fields is read as one."""
        ...

    def evaluate_settings(self) -> dict[str, Any]:
        """The env keyword arguments of the next evaluation (on top of `env.kwargs`)."""
        ...

    def on_evaluation(self, result: EvaluationResult, env_kwargs: dict[str, Any]) -> None:
        """Every evaluation's result, in the order they are reported, with the env keyword
        arguments (`evaluate_settings`) it ran with."""
        ...

    def solved(self) -> str | None:
        """A reason to end the run as solved (asked after each `on_evaluation`), or None."""
        ...

    def scalars(self) -> dict[str, float]:
        """Figures to log (`commander/<key>`), read on every scheduler tick."""
        ...


@runtime_checkable
class ScoresEvaluations(Protocol):
    """A commander that ranks evaluations for the run's best policy itself."""

    def score(self, result: EvaluationResult, env_kwargs: dict[str, Any]) -> float | None:
        """Higher is better; None: the evaluation does not count."""
        ...


@runtime_checkable
class KeepsState(Protocol):
    """A commander whose state rides in the coordinator's snapshots (JSON)."""

    def state_dict(self) -> dict[str, Any]:
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        ...


class BaseCommander:
    """A commander that changes nothing: every task runs `env.kwargs`. Subclass it."""

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg  # the run's config (`rlfleet.shared.run.config.RunConfig`)

    def collect_settings(self, worker_id: str, task_seed: int) -> TaskEnvSettings:
        return TaskEnvSettings()

    def evaluate_settings(self) -> dict[str, Any]:
        """By default the collect settings' env kwargs: evaluations measure the level the
        collectors play now."""
        got = self.collect_settings("evaluation", 0)
        if not isinstance(got, TaskEnvSettings):  # a mapping of the same fields
            got = TaskEnvSettings.model_validate(got)
        return dict(got.env_kwargs)

    def on_evaluation(self, result: EvaluationResult, env_kwargs: dict[str, Any]) -> None:
        return None

    def solved(self) -> str | None:
        return None

    def scalars(self) -> dict[str, float]:
        return {}

    def score(self, result: EvaluationResult, env_kwargs: dict[str, Any]) -> float | None:
        """How `result` (run with `env_kwargs`) ranks for the run's best policy: higher is
        better; None: it does not count. By default its mean return."""
        return result.return_mean

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs to go on where this one is (JSON); nothing by default."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Go on from `state_dict()`'s answer in a snapshot."""
        return None


COMMANDER = PluginKind("commander", required=(Commander,), subclass="rlfleet.BaseCommander")


def load_commander(cfg: Any) -> Commander | None:
    """The commander `coordinator.commander` names, made with `cfg` (None when unset).
    Raises `ConfigError` naming the field when the path does not import, names no class,
    or the class lacks a method or cannot be made."""
    path = cfg.coordinator.commander
    if path is None:
        return None
    return make_plugin(load_plugin(path, FIELD, COMMANDER), FIELD, cfg)
