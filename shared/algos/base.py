"""The one interface every algorithm implements, and how a config names one.

A `Policy` is both sides of an algorithm, in the spirit of DI-engine's policy modes but
behind a much smaller surface: collectors call `act`, `act_eval`, `bootstrap` and
`load_policy`; learners call `learn`, `policy_state`, `state_dict` and `load_state_dict`.
Nothing here knows HTTP, storage or threads, so the cluster and the single-process runner
drive the same objects.

Data conventions (what `learn` receives, as torch tensors with one row per transition):
- always: `obs`, `action`, `reward`, `next_obs`, `terminated`, `truncated`, `cut`;
  `cut` marks the last row of a time-contiguous run (an episode end, or where a chunk or an
  env's block of rows stops), so the row after a cut row does not follow it in time;
- whatever `act` returned in `ActOutput.extras`, one value per row (PPO: `log_prob`, `value`);
- `bootstrap_value` when `bootstrap` returns values: V(next_obs) on cut rows that did not
  terminate, 0 elsewhere;
- in games with illegal moves: `action_mask` (the legal actions at `obs`, bool, one column
  per action) and `next_action_mask` (at `next_obs`). Collectors pass the same mask to `act`
  and `act_eval` as `mask=`; an algorithm that supports masks never returns an illegal action.
Off-policy algorithms (`on_policy = False`) get minibatches sampled from replay buffers,
possibly with importance weights; on-policy ones get whole chunks concatenated (each chunk's
rows in order) from a queue buffer, once each.

A user's own algorithm: a class with this interface, constructed as `cls(cfg, spec, seed)`,
named in the config as `algo.policy: "package.module:ClassName"`.

Data parallel: a learner group hands its policy a `Reducer` (`set_reducer`) and gives each
rank a disjoint shard of every batch. The algorithm sums what must be global through it (its
gradients, and any statistic taken over a whole batch) so that every rank takes the step one
learner would take on the whole batch, and all ranks keep identical weights. A policy without
`set_reducer` can only learn alone (`learner.count: 1`).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

import numpy as np

from rlfleet.shared.envs.make import EnvSpec

# torch for annotations only: a collector acts, and the launcher checks a config, before
# torch (2-3 s to import) has loaded or without it.
if TYPE_CHECKING:
    import torch

BASE_FIELDS = ("obs", "action", "reward", "next_obs", "terminated", "truncated", "cut")


@dataclass
class ActOutput:
    """Actions for a batch of observations, and per-env values to store beside them."""

    actions: np.ndarray
    extras: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class LearnOutput:
    """Metrics stay 0-d tensors until someone reports them (`.item()` per step is costly);
    `priorities` has one entry per batch row for prioritized buffers (None: not computed)."""

    metrics: dict[str, torch.Tensor | float]
    priorities: torch.Tensor | None = None


@runtime_checkable
class Reducer(Protocol):
    """Sums tensors over the ranks of a data-parallel learner group. Every rank must call
    `sum_` the same number of times, in the same order, with tensors of the same shapes: it
    is a collective, and it raises (after the group's timeout at most) if a rank is gone."""

    rank: int
    world_size: int

    def sum_(self, tensors: list[torch.Tensor]) -> None:
        """Replace each tensor, in place, by its sum over all ranks (one collective)."""


@runtime_checkable
class Policy(Protocol):
    on_policy: ClassVar[bool]
    version: int            # policy version the acting side holds (-1: none yet)
    train_iterations: int   # gradient steps taken by the learning side

    def act(self, obs: np.ndarray, env_step: int, mask: np.ndarray | None = None
            ) -> ActOutput:
        """Actions with exploration; `env_step` is the run's global env step count, for
        schedules such as epsilon decay; `mask` (n, n_actions) bool: the legal actions."""

    def act_eval(self, obs: np.ndarray, deterministic: bool = True,
                 mask: np.ndarray | None = None) -> np.ndarray:
        """Actions for evaluation: greedy/mean when deterministic, sampled otherwise."""

    def bootstrap(self, obs: np.ndarray) -> np.ndarray | None:
        """State values used to bootstrap cut runs, or None if the algorithm needs none."""

    def learn(self, batch: Mapping[str, torch.Tensor],
              weights: torch.Tensor | None = None) -> LearnOutput:
        """Train on one batch (off-policy) or one rollout of whole chunks (on-policy)."""

    def policy_state(self) -> dict[str, torch.Tensor]:
        """What collectors need to act: published as a policy version."""

    def load_policy(self, version: int, state: Mapping[str, torch.Tensor]) -> None:
        """Adopt published weights for acting."""

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Everything needed to continue training (networks, optimizer, counters)."""

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        ...


class ImportPathError(ValueError):
    """An import path (`package.module:attr`) that does not lead to an object."""


def load_object(path: str, what: str) -> Any:
    """The object `path` names; the error says what was looked up and what failed.
    `what` names the config field, e.g. "algo.policy"."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise ImportPathError(f"{what}={path!r}: expected 'package.module:attr'")
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


BUILTIN = {"dqn": "rlfleet.shared.algos.dqn:DQN", "cql": "rlfleet.shared.algos.cql:CQL",
           "bc": "rlfleet.shared.algos.bc:BehaviourCloning", "ppo": "rlfleet.shared.algos.ppo:PPO"}


def policy_class(algo_cfg: Any) -> type:
    """The class a config's `algo` section names: `algo.policy` if set, else the built-in
    algorithm for `algo.name`."""
    if algo_cfg.policy:
        cls = load_object(algo_cfg.policy, "algo.policy")
        missing = [m for m in ("act", "act_eval", "bootstrap", "learn", "policy_state",
                               "load_policy", "state_dict", "load_state_dict", "on_policy")
                   if not hasattr(cls, m)]
        if not isinstance(cls, type) or missing:
            raise ImportPathError(f"algo.policy={algo_cfg.policy!r} is not a Policy class"
                                  + (f": it lacks {', '.join(missing)}" if missing else ""))
        return cls
    return load_object(BUILTIN[algo_cfg.name], "algo.name")


def make_policy(algo_cfg: Any, spec: EnvSpec, seed: int) -> Policy:
    return policy_class(algo_cfg)(algo_cfg, spec, seed)


# Built-in algorithms that need a discrete action space: what `check_run_config(build=False)`
# checks without importing them (and torch); their constructors check it again.
DISCRETE_ONLY = {"dqn", "cql"}


def check_run_config(cfg: Any, build: bool = True) -> None:
    """Import and build what a run's config names (its env and its policy), so a wrong
    import path or an algorithm that cannot act in the env is a config error at launch, not
    a crash in every worker. Raises `ConfigError` naming the field.

    `build=False` checks a built-in algorithm's needs of the env without building it, so the
    caller (`rlfleet up`) never imports torch; a policy or an `algo.reward_model` named by
    import path is always built, since only building it can show it works."""
    from rlfleet.shared.contract.config import ConfigError
    from rlfleet.shared.envs.make import env_spec

    try:
        if cfg.league is not None:
            from rlfleet.shared.envs.games.match import GameError, game_spec

            try:
                spec = game_spec(cfg.env.id, cfg.env.kwargs)
            except GameError as err:
                raise ConfigError(f"env.id={cfg.env.id!r}: {err}") from None
        else:
            spec = env_spec(cfg.env)
    except ConfigError:
        raise
    except ImportPathError as err:
        raise ConfigError(str(err)) from None
    except Exception as err:  # gymnasium's own errors: unknown id, bad kwargs
        raise ConfigError(f"env.id={cfg.env.id!r}: {type(err).__name__}: {err}") from None
    if getattr(cfg.algo, "her", None) is not None and getattr(spec, "goal", None) is None:
        raise ConfigError(f"algo.her: hindsight relabelling needs a goal-conditioned env "
                          f"(a Dict observation of observation, achieved_goal and "
                          f"desired_goal); {cfg.env.id!r} has observations of shape "
                          f"{spec.obs_shape}")
    if any(b.kind == "dataset" for b in cfg.buffers.values()) or cfg.eval.dataset:
        from rlfleet.shared.data.datasets import check_datasets

        check_datasets(cfg, spec)
    if not build and not cfg.algo.policy and cfg.algo.reward_model is None:
        if cfg.algo.name in DISCRETE_ONLY and not spec.discrete:
            raise ConfigError(f"algo: algo.name={cfg.algo.name!r} needs a discrete action "
                              f"space; this env has continuous actions of shape "
                              f"{spec.action_shape}")
        return
    try:
        make_policy(cfg.algo, spec, cfg.seed)
    except ImportPathError as err:
        raise ConfigError(str(err)) from None
    except (ValueError, TypeError) as err:
        raise ConfigError(f"algo: {err}") from None
    if cfg.algo.reward_model is not None:
        from rlfleet.shared.algos.reward_model import check_reward_model

        check_reward_model(cfg, spec)
