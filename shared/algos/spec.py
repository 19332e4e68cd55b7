"""How an algorithm describes itself to the rest of the system: its `AlgoSpec`.

Each built-in algorithm is one folder (`rlfleet/shared/algos/<name>/`: its config model,
its policy, and in `__init__.py` its spec) and one line in `registry.py`. Everything outside
the folder that needs to know something about an algorithm reads it here: the run config
picks the config class by `name`, the launch check reads the action spaces, buffer kinds and
the algorithm's own checks, collectors read the random warm-up, learners build the policy.
Importing a spec never imports torch: the policy class is named by import path and loaded
when a policy is built.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

from rlfleet.shared.contract.algo import AlgoConfig
from rlfleet.shared.contract.config import Frozen
from rlfleet.shared.contract.spec import EnvSpec
from rlfleet.shared.util.imports import load_object

ActionSpace = Literal["discrete", "continuous"]
# Every buffer kind but the queue: what an off-policy algorithm samples transitions from.
SAMPLED_KINDS = frozenset({"uniform", "prioritized", "episode", "sequence", "dataset"})


class Learning(StrEnum):
    """How an algorithm learns; the learner runs the training loop of its kind.

    - `ON_POLICY`: whole rollouts of one queue buffer, each learned from once, a version
      published after each (PPO, APPO);
    - `OFF_POLICY`: batches sampled from replay buffers that collectors keep filling (DQN,
      SAC, R2D2);
    - `OFFLINE`: batches sampled from data that is there before the run starts, datasets
      (BC, CQL); collectors, if any, only evaluate.
    """

    ON_POLICY = "on-policy"
    OFF_POLICY = "off-policy"
    OFFLINE = "offline"

    @classmethod
    def of_policy(cls, on_policy: bool) -> Learning:
        """The kind of a user's policy (`algo.policy`), which says only `on_policy`."""
        return cls.ON_POLICY if on_policy else cls.OFF_POLICY


def no_warmup(cfg: Any) -> int:
    return 0


@dataclass(frozen=True)
class AlgoSpec:
    """An algorithm, as the system sees it.

    - `config`: its pydantic settings (with `name: Literal[<name>]`), beside its code.
    - `policy`: import path of its `Policy` class, built as `cls(cfg.algo, env_spec, seed)`.
    - `learning`: how it learns (`Learning`): the learner's loop, and whether it learns
      from whole chunks of one queue buffer, each once (`on_policy`), or from transitions
      sampled from replay buffers or datasets.
    - `action_spaces`: the action spaces it can act in.
    - `buffer_kinds`: the buffer kinds `learner.mix` may draw from for it.
    - `capabilities`: the names of the optional capabilities
      (`rlfleet.shared.algos.capabilities`) its policy implements; a test builds each
      built-in policy and holds this to what `isinstance` says.
    - `check(cfg, env)`: its own rules for a run, given the env's spec; raises `ValueError`
      naming the field (the launch check makes it a config error).
    - `warmup(cfg)`: env steps of the run during which collectors may act uniformly at random
      instead of waiting for the first policy version (0: never), because the algorithm
      itself would act so.
    """

    name: str
    title: str
    config: type[AlgoConfig]
    policy: str
    learning: Learning
    action_spaces: frozenset[ActionSpace]
    buffer_kinds: frozenset[str]
    capabilities: frozenset[str] = frozenset()
    check: Callable[[Any, EnvSpec], None] | None = None
    warmup: Callable[[Any], int] = no_warmup

    @property
    def on_policy(self) -> bool:
        return self.learning is Learning.ON_POLICY

    def policy_class(self) -> type:
        """The policy class (imports it, and torch with it)."""
        return load_object(self.policy, "algo.name")

    def check_env(self, cfg: Any, env: EnvSpec) -> None:
        """This algorithm's needs of the run's env: its action space, then its own check."""
        space: ActionSpace = "discrete" if env.discrete else "continuous"
        if space not in self.action_spaces:
            what = (f"discrete actions ({env.n_actions})" if env.discrete
                    else f"continuous actions of shape {env.action_shape}")
            need = " or ".join(sorted(self.action_spaces))
            raise ValueError(f"algo.name={self.name!r} needs a {need} action space; this env "
                             f"has {what}")
        if self.check is not None:
            self.check(cfg, env)


@dataclass(frozen=True)
class RewardModelSpec:
    """A reward model, as the system sees it: `config` is the pydantic model of its kwargs
    (errors name `algo.reward_model.kwargs.<field>`), `model` the import path of its class,
    built as `cls(env_spec, seed=seed, **kwargs)`."""

    name: str
    config: type[Frozen]
    model: str
    capabilities: frozenset[str] = field(default_factory=frozenset)

    def model_class(self) -> type:
        return load_object(self.model, "algo.reward_model")
