"""Whether a run's config can run: the one place that answers it.

`check_runnable` builds what the config names (its env or game, its datasets, its policy
and reward model) and checks them against each other, so that a config that passes it never
makes a role refuse it: a wrong import path, an algorithm that cannot act in the env or
learn from the buffers it is given, a policy whose hooks have the wrong signatures, or a
learner group the policy cannot learn in is a `ConfigError` naming the field at launch, not a
crash in every worker. `rlfleet up` runs it before anything starts, and `rlfleet check`
prints what it found.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlfleet.shared.algos.capabilities import (
    class_capabilities,
    hook_problems,
    near_misses,
)
from rlfleet.shared.algos.registry import algo_spec
from rlfleet.shared.contract.algo import HindsightSettings
from rlfleet.shared.contract.commander import load_commander
from rlfleet.shared.contract.config import ConfigError
from rlfleet.shared.contract.spec import EnvSpec
from rlfleet.shared.run.config import RunConfig
from rlfleet.shared.util.imports import ImportPathError

# eval.dataset metrics that read Q-values
Q_METRICS = ("td_error", "return_prediction")


@dataclass
class Checked:
    """What `check_runnable` found: the env's spec, and (when it built the policy) the
    policy's class, its capabilities and names that look like misspelt hooks."""

    env: EnvSpec
    policy_class: type | None = None
    capabilities: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def run_env_spec(cfg: RunConfig) -> EnvSpec:
    """The spec of the run's env (a league's game: one side's view of it); any failure is a
    `ConfigError` naming `env.id`."""
    from rlfleet.shared.envs.make import run_spec

    try:
        return run_spec(cfg)
    except ConfigError:
        raise
    except ImportPathError as err:
        raise ConfigError(str(err)) from None
    except Exception as err:  # gymnasium's own errors (unknown id, bad kwargs), a game's
        from rlfleet.shared.envs.games.match import GameError

        what = "" if isinstance(err, GameError) else f"{type(err).__name__}: "
        raise ConfigError(f"env.id={cfg.env.id!r}: {what}{err}") from None


def check_hooks(cfg: RunConfig) -> None:
    """The learner's hooks import and can be made (the logger's writers are checked by
    `rlfleet check`, which may import the telemetry layer)."""
    if cfg.learner.hooks:
        from rlfleet.shared.algos.hooks import load_hooks

        load_hooks(cfg.learner.hooks)


def check_runnable(cfg: RunConfig, build: bool = True) -> Checked:
    """Build and check what a run's config names; raises `ConfigError` naming the field.

    `build=False` checks a built-in algorithm from its spec without building it, so the
    caller (`rlfleet up`) never imports torch; a policy or a reward model named by import
    path is always built, since only building it can show it works."""
    env = run_env_spec(cfg)
    load_commander(cfg)  # `coordinator.commander`: a bad one is a ConfigError naming it
    check_hooks(cfg)
    if isinstance(cfg.algo, HindsightSettings) and cfg.algo.her is not None \
            and env.goal is None:
        raise ConfigError(f"algo.her: hindsight relabelling needs a goal-conditioned env (a "
                          f"Dict observation of observation, achieved_goal and "
                          f"desired_goal); {cfg.env.id!r} has observations of shape "
                          f"{env.obs_shape}")
    if any(b.kind == "dataset" for b in cfg.buffers.values()) or cfg.eval.dataset:
        from rlfleet.shared.data.datasets import check_datasets

        check_datasets(cfg, env)
    if cfg.algo.policy is None:
        spec = algo_spec(cfg.algo.name)
        try:
            spec.check_env(cfg, env)
        except ValueError as err:
            raise ConfigError(str(err)) from None
        _check_capabilities(cfg, spec.title, set(spec.capabilities))
        if not build and cfg.algo.reward_model is None:
            return Checked(env, capabilities=sorted(spec.capabilities))
    return _check_built(cfg, env)


def _check_capabilities(cfg: RunConfig, what: str, capabilities: set[str]) -> None:
    """What the run asks of the policy beyond `Policy`."""
    if cfg.learner.count > 1 and "DataParallel" not in capabilities:
        raise ConfigError(f"learner.count={cfg.learner.count}: {what} cannot learn in a "
                          "learner group (it is not DataParallel: it has no set_reducer); "
                          "use one learner")
    if cfg.eval.dataset is not None and cfg.eval.dataset.metric in Q_METRICS \
            and "QValues" not in capabilities:
        raise ConfigError(f"eval.dataset.metric={cfg.eval.dataset.metric}: needs Q-values; "
                          f"{what} gives none (it is not QValues: use algo.name dqn or cql)")
    if cfg.collector.epsilon_schedule == "apex" and "EpsilonGreedy" not in capabilities:
        raise ConfigError(f"collector.epsilon_schedule=apex gives each collector a fixed "
                          f"epsilon; {what} takes none (it is not EpsilonGreedy: it has no "
                          "epsilon and set_epsilon)")


def _check_built(cfg: RunConfig, env: EnvSpec) -> Checked:
    """Build the policy (and reward model) and check what only a built one shows."""
    from rlfleet.shared.algos.capabilities import capabilities_of
    from rlfleet.shared.algos.registry import make_policy, policy_class

    try:
        cls = policy_class(cfg.algo)
    except ImportPathError as err:
        raise ConfigError(str(err)) from None
    field_name = "algo.policy" if cfg.algo.policy else "algo.name"
    problems = hook_problems(cls)
    if problems:
        raise ConfigError(f"{field_name}={cfg.algo.policy or cfg.algo.name!r}: "
                          + "; ".join(problems))
    try:
        policy = make_policy(cfg.algo, env, cfg.seed)
    except (ValueError, TypeError) as err:
        raise ConfigError(f"algo: {err}") from None
    caps = [c.__name__ for c in capabilities_of(policy)]
    if cfg.algo.policy is not None:
        what = f"algo.policy={cfg.algo.policy!r}"
        problem = cfg.feed_problem(what, bool(policy.on_policy))
        if problem:
            raise ConfigError(problem)
        _check_capabilities(cfg, what, set(caps))
    if cfg.algo.reward_model is not None:
        from rlfleet.shared.algos.reward_model import check_reward_model

        check_reward_model(cfg, env)
    return Checked(env, cls, caps, near_misses(cls))


def describe_policy_class(cls: type) -> str:
    """What `rlfleet check` says of a class: the capabilities it defines."""
    caps = [c.__name__ for c in class_capabilities(cls)]
    return (f"{cls.__module__}:{cls.__qualname__} implements Policy"
            + (f" and {', '.join(caps)}" if caps else ""))
