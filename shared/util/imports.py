"""Objects named by import path (`package.module:attr`), as configs name a user's env, policy,
reward model or bot.

Paths written before the package was `rlfleet` (`shared.algos.rnd:RND`, in configs and in
every run directory's saved `config.yaml`) still resolve: `load_object` reads them as the
module's new name and warns once per path, naming the path to write instead.

Modules that moved inside `rlfleet` (`rlfleet.coordinator.replay` is
`rlfleet.shared.replay` now) resolve by their old names too, in imports and in import
paths alike: `install_redirects` (run by `import rlfleet`) puts a finder in front of
Python's that answers an old name with the module of its new one, warning once per name.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """A package's module-level `__getattr__` (PEP 562) that imports each exported name from
    its module (`exports`: name -> module) on first use, so that importing the package root
    (a role's, which the single-process runner reaches its services through) pays for none
    of them: a process that needs one module of a role loads no other."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return vars(importlib.import_module(module))[name]

    return __getattr__


class ImportPathError(ValueError):
    """An import path (`package.module:attr`) that does not lead to an object."""


class RlfleetDeprecationWarning(DeprecationWarning):
    """Something rlfleet still accepts but will stop accepting; shown once per thing."""


# Shown by default (Python hides DeprecationWarning outside __main__): a user whose config
# names an old path should see what to write instead.
warnings.simplefilter("always", RlfleetDeprecationWarning)

# Each module of the package's first layout, and its name in `rlfleet`. The top-level names
# `shared`, `services`, `coordinator`, `collector` and `learner` are not installed.
MOVED_MODULES = {
    "shared.algos.adam": "rlfleet.shared.algos.adam",
    "shared.algos.base": "rlfleet.shared.algos.base",
    "shared.algos.bc": "rlfleet.shared.algos.bc",
    "shared.algos.cql": "rlfleet.shared.algos.cql",
    "shared.algos.dqn": "rlfleet.shared.algos.dqn",
    "shared.algos.nets": "rlfleet.shared.algos.nets",
    "shared.algos.obsnorm": "rlfleet.shared.algos.obsnorm",
    "shared.algos.ppo": "rlfleet.shared.algos.ppo",
    "shared.algos.reward_model": "rlfleet.shared.algos.reward_model",
    "shared.algos.rnd": "rlfleet.shared.algos.rnd",
    "shared.bitflip": "rlfleet.shared.envs.bitflip",
    "shared.datasets": "rlfleet.shared.data.datasets",
    "shared.envpool_vec": "rlfleet.shared.envs.envpool_vec",
    "shared.envs": "rlfleet.shared.envs.make",
    "shared.games.bots": "rlfleet.shared.envs.games.bots",
    "shared.games.match": "rlfleet.shared.envs.games.match",
    "shared.games.tictactoe": "rlfleet.shared.envs.games.tictactoe",
    "shared.goals": "rlfleet.shared.envs.goals",
    "shared.moments": "rlfleet.shared.util.moments",
    "shared.rundata": "rlfleet.shared.telemetry.rundata",
    "shared.video": "rlfleet.shared.telemetry.video",
}
_OLD_TOP_LEVEL = ("shared", "services", "coordinator", "collector", "learner")
_warned: set[str] = set()


def _our_old_folder(top: str) -> bool:
    """Whether the top-level name `top` finds one of rlfleet's own folders (the repository's
    `shared/`, seen from a directory on the path): importing it would load our modules a
    second time under another name. A user's own package of that name is theirs."""
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return False
    if spec is None or not spec.submodule_search_locations:
        return False
    found = {Path(p).resolve() for p in spec.submodule_search_locations}
    ours = {Path(p).resolve() for name in ("rlfleet", "rlfleet.shared", "rlfleet.coordinator",
                                          "rlfleet.collector", "rlfleet.learner")
            for p in importlib.import_module(name).__path__}
    return bool(found & ours)


def current_path(path: str) -> str | None:
    """The path to write today for a path in the package's first layout, or None when
    `path` is not one."""
    module, sep, attr = path.partition(":")
    if module.split(".")[0] not in _OLD_TOP_LEVEL:
        return None
    new = MOVED_MODULES.get(module)
    if new is None:
        return None
    return f"{new}{sep}{attr}"


def load_object(path: str, what: str) -> Any:
    """The object `path` names; the error says what was looked up and what failed.
    `what` names the config field, e.g. "algo.policy"."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ImportPathError(f"{what}={path!r}: expected 'package.module:attr'")
    moved = current_path(path)
    if moved is None and module_name.split(".")[0] in _OLD_TOP_LEVEL \
            and _our_old_folder(module_name.split(".")[0]):
        raise ImportPathError(f"{what}={path!r}: rlfleet's modules are under 'rlfleet.' now, "
                              f"and {module_name!r} is not one that moved there")
    if moved is not None:
        if path not in _warned:
            _warned.add(path)
            warnings.warn(f"{what}={path!r} is an old import path: write {moved!r}",
                          RlfleetDeprecationWarning, stacklevel=2)
        module_name, _, attr = moved.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ImportPathError(f"{what}={path!r}: cannot import module {module_name!r} "
                              f"({err})") from None
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ImportPathError(f"{what}={path!r}: module {module_name!r} has no attribute "
                                  f"{attr!r}") from None
    return obj


# Modules that moved inside the package: old name -> new name (`RENAMED_MODULES`). An import
# of the old name gets the new module itself (one object under both names), with one
# `RlfleetDeprecationWarning` per name naming the new one.
RENAMED_MODULES: dict[str, str] = {
    # the library the roles shared by importing each other's internals, now `shared/`
    "rlfleet.coordinator.replay": "rlfleet.shared.replay.replay",
    "rlfleet.coordinator.datasets": "rlfleet.shared.replay.datasets",
    "rlfleet.coordinator.buffers.base": "rlfleet.shared.replay.buffers.base",
    "rlfleet.coordinator.buffers.dataset": "rlfleet.shared.replay.buffers.dataset",
    "rlfleet.coordinator.buffers.episode": "rlfleet.shared.replay.buffers.episode",
    "rlfleet.coordinator.buffers.queue": "rlfleet.shared.replay.buffers.queue",
    "rlfleet.coordinator.buffers.ratelimit": "rlfleet.shared.replay.buffers.ratelimit",
    "rlfleet.coordinator.buffers.ring": "rlfleet.shared.replay.buffers.ring",
    "rlfleet.coordinator.buffers.sequence": "rlfleet.shared.replay.buffers.sequence",
    "rlfleet.coordinator.buffers.sumtree": "rlfleet.shared.replay.buffers.sumtree",
    "rlfleet.coordinator.buffers": "rlfleet.shared.replay.buffers",
    "rlfleet.coordinator.league": "rlfleet.shared.league.league",
    "rlfleet.coordinator.matchmaking": "rlfleet.shared.league.matchmaking",
    "rlfleet.collector.rollout": "rlfleet.shared.rollout.rollout",
    "rlfleet.collector.battle": "rlfleet.shared.rollout.battle",
    "rlfleet.learner.batching": "rlfleet.shared.batching.batching",
    "rlfleet.learner.transforms": "rlfleet.shared.batching.transforms",
    "rlfleet.learner.arena": "rlfleet.shared.batching.arena",
    # the learner's modules, grouped by job (feed, group, output, observe)
    "rlfleet.learner.sampling": "rlfleet.learner.feed.sampling",
    "rlfleet.learner.prefetch": "rlfleet.learner.feed.prefetch",
    "rlfleet.learner.dataproc": "rlfleet.learner.feed.dataproc",
    "rlfleet.learner.shm": "rlfleet.learner.feed.shm",
    "rlfleet.learner.rollouts": "rlfleet.learner.feed.rollouts",
    "rlfleet.learner.staging": "rlfleet.learner.feed.staging",
    "rlfleet.learner.session": "rlfleet.learner.group.session",
    "rlfleet.learner.collectives": "rlfleet.learner.group.collectives",
    "rlfleet.learner.publisher": "rlfleet.learner.output.publisher",
    "rlfleet.learner.weight_relay": "rlfleet.learner.output.weight_relay",
    "rlfleet.learner.checkpoints": "rlfleet.learner.output.checkpoints",
    "rlfleet.learner.reporter": "rlfleet.learner.output.reporter",
    "rlfleet.learner.feedback": "rlfleet.learner.output.feedback",
    "rlfleet.learner.timers": "rlfleet.learner.observe.timers",
    "rlfleet.learner.metric_window": "rlfleet.learner.observe.metric_window",
    "rlfleet.learner.shortage": "rlfleet.learner.observe.shortage",
    "rlfleet.learner.histograms": "rlfleet.learner.observe.histograms",
    "rlfleet.learner.batch_log": "rlfleet.learner.observe.batch_log",
    "rlfleet.learner.dataset_eval": "rlfleet.learner.observe.dataset_eval",
}


class _Redirects(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers an old module name with the new module (`RENAMED_MODULES`)."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: types.ModuleType | None = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in RENAMED_MODULES:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        new = RENAMED_MODULES[spec.name]
        if spec.name not in _warned:
            _warned.add(spec.name)
            warnings.warn(f"{spec.name} moved: import {new}", RlfleetDeprecationWarning,
                          stacklevel=2)
        # The new module keeps its own name and spec (the import system sets only what a
        # module lacks); it is registered under the old name as well.
        return importlib.import_module(new)

    def exec_module(self, module: types.ModuleType) -> None:
        return None


_REDIRECTS = _Redirects()


def install_redirects() -> None:
    """Put the finder of moved modules first on `sys.meta_path`, once."""
    if _REDIRECTS not in sys.meta_path:
        sys.meta_path.insert(0, _REDIRECTS)
