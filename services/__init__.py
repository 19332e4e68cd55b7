"""rlfleet: distributed reinforcement-learning training.

One coordinator, any number of collectors and learners, talking HTTP and sharing experience
and policy weights through storage. The package's folders are its layers:

- `rlfleet.shared`: what the roles share, in layers that import downward only (the contract,
  infrastructure, envs, data, algorithms, telemetry);
- `rlfleet.coordinator`, `rlfleet.collector`, `rlfleet.learner`: the three roles, which never
  import each other;
- `rlfleet` itself (this folder, `services/` in the repository): how processes start, the
  `rlfleet` command (`rlfleet.cli`), the local launcher, the single-process runner.

`rlfleet.up(...)` and `rlfleet.single(...)` start a run from Python and return a `Run` to
watch and stop it (`rlfleet.api`). The names below are the public API, imported on first
use so that `import rlfleet` stays cheap (a collector never pays for torch, a status command
never for gymnasium).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from rlfleet.shared.util.imports import install_redirects

install_redirects()  # modules that moved keep their old names, with a warning

# name -> the module that defines it
_PUBLIC = {
    "Policy": "rlfleet.shared.algos.base",
    "LearnerHook": "rlfleet.shared.algos.hooks",
    "HookContext": "rlfleet.shared.algos.hooks",
    "BaseCommander": "rlfleet.shared.contract.commander",
    "Commander": "rlfleet.shared.contract.commander",
    "TaskEnvSettings": "rlfleet.shared.contract.commander",
    "MetricWriter": "rlfleet.shared.telemetry.log_writers",
    "VideoWriter": "rlfleet.shared.telemetry.log_writers",
    "HistogramWriter": "rlfleet.shared.telemetry.log_writers",
    "ActOutput": "rlfleet.shared.algos.base",
    "LearnOutput": "rlfleet.shared.algos.base",
    "Reducer": "rlfleet.shared.algos.base",
    "EnvSpec": "rlfleet.shared.contract.spec",
    "RunConfig": "rlfleet.shared.run.config",
    "ConfigError": "rlfleet.shared.contract.config",
    "load_config": "rlfleet.shared.run.config",
    "parse_config": "rlfleet.shared.run.config",
    "load_run": "rlfleet.shared.telemetry.rundata",
    "up": "rlfleet.api",
    "single": "rlfleet.api",
    "Run": "rlfleet.api",
    "RunStatus": "rlfleet.api",
}

__all__ = ["ActOutput", "BaseCommander", "Commander", "ConfigError", "EnvSpec",
           "HistogramWriter", "HookContext", "LearnOutput", "LearnerHook", "MetricWriter",
           "Policy", "Reducer", "Run", "RunConfig", "RunStatus", "TaskEnvSettings",
           "VideoWriter", "__version__", "load_config", "load_run", "parse_config", "single",
           "up"]

if TYPE_CHECKING:
    from rlfleet.api import Run, RunStatus, single, up
    from rlfleet.shared.algos.base import ActOutput, LearnOutput, Policy, Reducer
    from rlfleet.shared.algos.hooks import HookContext, LearnerHook
    from rlfleet.shared.contract.commander import BaseCommander, Commander, TaskEnvSettings
    from rlfleet.shared.contract.config import ConfigError
    from rlfleet.shared.contract.spec import EnvSpec
    from rlfleet.shared.run.config import RunConfig, load_config, parse_config
    from rlfleet.shared.telemetry.log_writers import HistogramWriter, MetricWriter, VideoWriter
    from rlfleet.shared.telemetry.rundata import load_run


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("rlfleet")
        except PackageNotFoundError:  # imported from a source tree that was never installed
            return "0+unknown"
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'rlfleet' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return __all__
