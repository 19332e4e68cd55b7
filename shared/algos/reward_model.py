"""Reward models: what rewrites the rewards an algorithm trains on, named by name or path.

A reward model sits between the data and the algorithm's loss on the learning side only:

    model = RND(spec, seed=0, scale=1.0)           # cls(env_spec, seed=seed, **kwargs)
    for batch in batches:                           # sampled transitions, or a rollout
        rewards = model.estimate(batch)             # one reward per row: what to train on
        metrics = model.train(batch)                # the model learns from the same rows
        policy.learn({**batch, "reward": rewards}, weights)

`WithRewardModel` is that loop wrapped as a `Policy`, so the learner service, the
single-process runner, checkpoints (its state is in the policy's `state_dict`, under
`reward_model.`), a learner group's state broadcast and resume all carry the model without
knowing of it. Collectors never build one: they store the env's own rewards, and stored chunks
are never changed, since the rewritten rewards exist only in the learner's batch.

A config names one as `algo.reward_model: {path: rnd, kwargs: {...}}` (a built-in one by
its registry name) or `{path: package.module:Class, ...}` (or just the name or path).
`check_reward_model` builds it at launch (`rlfleet check`), so a wrong path or kwargs is a
config error naming `algo.reward_model`, not a crash in the learner.

In a learner group each rank sees a shard of every batch: a model that keeps ranks alike
(summing its gradients and statistics through the `Reducer`, as the built-in RND does) is
`DataParallel`; one that is not is refused for `learner.count > 1`. The wrapped policy keeps
its capabilities: `with_reward_model` gives it a class that passes each on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from pydantic import ValidationError

from rlfleet.shared.algos.base import ActOutput, LearnOutput, Optimizer, Policy, Reducer
from rlfleet.shared.algos.capabilities import (
    DataParallel,
    EpsilonGreedy,
    NormalizesObservations,
    Optimized,
    QValues,
    SeededActing,
)
from rlfleet.shared.algos.registry import REWARD_MODELS
from rlfleet.shared.contract.config import ConfigError
from rlfleet.shared.contract.plugins import PluginKind, load_plugin
from rlfleet.shared.contract.spec import EnvSpec
from rlfleet.shared.util.moments import RunningMoments

FIELD = "algo.reward_model"
PREFIX = "reward_model."


@runtime_checkable
class RewardModel(Protocol):
    """Constructed as `cls(spec, seed=seed, **kwargs)`. Batches are what the algorithm's
    `learn` receives (`shared/algos/base.py`): torch tensors, one row per transition, with at
    least `obs`, `action`, `reward`, `next_obs`, `terminated`. Neither method may change the
    batch's tensors in place (they may be views of the learner's shared memory)."""

    def estimate(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The rewards to train on, one per row (float32, the shape of `batch["reward"]`):
        the env's reward plus a bonus, or a learned reward instead of it. Called without
        gradients, before `train` on the same batch."""

    def train(self, batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor | float]:
        """Learn from the batch; metrics to log (as `train/reward_model/<name>`)."""

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Everything to continue training it, as tensors (checkpoints are safetensors)."""

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        ...


REWARD_MODEL = PluginKind("reward model", required=(RewardModel,))


def reward_model_class(path: str) -> type:
    """The class `path` names (a built-in model's name, or an import path), checked to have
    the interface; `ConfigError` naming the field otherwise."""
    return load_plugin(REWARD_MODELS[path].model if path in REWARD_MODELS else path, FIELD,
                       REWARD_MODEL)


def make_reward_model(algo_cfg: Any, spec: EnvSpec, seed: int) -> RewardModel:
    rm = algo_cfg.reward_model
    return reward_model_class(rm.path)(spec, seed=seed, **rm.kwargs)


def check_reward_model(cfg: Any, spec: EnvSpec) -> None:
    """Build the reward model a run's config names and try it on a few rows of zeros, so a
    wrong path, bad kwargs or an env it cannot handle is a `ConfigError` naming the field at
    launch. A model that cannot learn in a group is refused for `learner.count > 1`."""
    rm = cfg.algo.reward_model
    if rm is None:
        return
    cls = reward_model_class(rm.path)
    try:
        model = cls(spec, seed=cfg.seed, **rm.kwargs)
    except ValidationError as err:  # a built-in model's settings (its config model)
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}={e.get('input')!r}: "
                             f"{e['msg']}" for e in err.errors())
        raise ConfigError(f"{FIELD}.kwargs: {rm.path} cannot be built with {rm.kwargs}: "
                          f"{problems}") from None
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{FIELD}.kwargs: {rm.path} cannot be built with "
                          f"{rm.kwargs}: {err}") from None
    if cfg.learner.count > 1 and not isinstance(model, DataParallel):
        raise ConfigError(f"{FIELD}={rm.path!r} has no set_reducer: it cannot learn in a "
                          f"learner group (learner.count={cfg.learner.count}); use one learner")
    try:
        rewards = model.estimate(_zeros(spec, 2))
    except Exception as err:  # its own code: whatever it raises is the user's to see
        raise ConfigError(f"{FIELD}={rm.path!r}: estimate() on a batch of this env failed: "
                          f"{type(err).__name__}: {err}") from None
    if not isinstance(rewards, torch.Tensor) or tuple(rewards.shape) != (2,):
        got = tuple(rewards.shape) if isinstance(rewards, torch.Tensor) else type(rewards)
        raise ConfigError(f"{FIELD}={rm.path!r}: estimate() must return one reward per row "
                          f"(a tensor of shape (2,) for 2 rows), got {got}")


def _zeros(spec: EnvSpec, n: int) -> dict[str, torch.Tensor]:
    """A batch of `n` rows of zeros in the env's shapes (images stay uint8)."""
    obs_dtype = torch.uint8 if len(spec.obs_shape) == 3 else torch.float32
    action = (torch.zeros(n, dtype=torch.int64) if spec.discrete
              else torch.zeros((n, *spec.action_shape)))
    return {"obs": torch.zeros((n, *spec.obs_shape), dtype=obs_dtype), "action": action,
            "reward": torch.zeros(n), "next_obs": torch.zeros((n, *spec.obs_shape),
                                                              dtype=obs_dtype),
            "terminated": torch.zeros(n, dtype=torch.bool)}


class WithRewardModel:
    """A policy whose `learn` trains on a reward model's rewards. Acting, publishing and
    everything else are the wrapped policy's; `with_reward_model` builds a subclass that
    also passes on each capability the policy has."""

    def __init__(self, policy: Policy, model: RewardModel) -> None:
        self.policy = policy
        self.model = model

    # The counters are the wrapped policy's own: the learner reads (and sets) them there.
    @property
    def on_policy(self) -> bool:
        return self.policy.on_policy

    @property
    def train_iterations(self) -> int:
        return self.policy.train_iterations

    @train_iterations.setter
    def train_iterations(self, value: int) -> None:
        self.policy.train_iterations = value

    @property
    def version(self) -> int:
        return self.policy.version

    @version.setter
    def version(self, value: int) -> None:
        self.policy.version = value

    # -- learning -----------------------------------------------------------------------------

    def learn(self, batch: Mapping[str, torch.Tensor],
              weights: torch.Tensor | None = None) -> LearnOutput:
        """Rewrite the batch's rewards with the model's estimate (a new tensor: the batch's
        own are left alone), train the model on the batch, then the policy on the rewrite.
        A rank's empty share of a group's rollout (`{}`) is passed on as it is; the model
        still trains on it, since its collectives need every rank."""
        rewards = None
        if "reward" in batch:
            with torch.no_grad():
                rewards = self.model.estimate(batch)
            if rewards.shape != batch["reward"].shape:
                raise ValueError(f"{type(self.model).__name__}.estimate returned rewards of "
                                 f"shape {tuple(rewards.shape)} for "
                                 f"{tuple(batch['reward'].shape)} rows")
            batch_used = {**batch, "reward": rewards.to(torch.float32)}
        else:
            batch_used = dict(batch)
        model_metrics = self.model.train(batch)
        out = self.policy.learn(batch_used, weights)
        out.metrics.update({f"reward_model/{k}": v for k, v in model_metrics.items()})
        if rewards is not None and len(rewards):
            out.metrics["reward_model/reward_mean"] = rewards.mean()
        return out

    # -- the acting half, passed through ------------------------------------------------------

    def act(self, obs: np.ndarray, env_step: int, mask: np.ndarray | None = None
            ) -> ActOutput:
        return self.policy.act(obs, env_step, mask)

    def act_eval(self, obs: np.ndarray, deterministic: bool = True,
                 mask: np.ndarray | None = None) -> np.ndarray:
        return self.policy.act_eval(obs, deterministic, mask)

    def bootstrap(self, obs: np.ndarray) -> np.ndarray | None:
        return self.policy.bootstrap(obs)

    def policy_state(self) -> dict[str, torch.Tensor]:
        return self.policy.policy_state()

    def load_policy(self, version: int, state: Mapping[str, torch.Tensor]) -> None:
        self.policy.load_policy(version, state)

    # -- checkpoints --------------------------------------------------------------------------

    def state_dict(self) -> dict[str, torch.Tensor]:
        out = self.policy.state_dict()
        clash = [k for k in out if k.startswith(PREFIX)]
        if clash:
            raise ValueError(f"the policy's state has keys under {PREFIX!r} ({clash[0]}), "
                             "where the reward model's state goes")
        out.update({PREFIX + k: v for k, v in self.model.state_dict().items()})
        return out

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        own = {k[len(PREFIX):]: v for k, v in state.items() if k.startswith(PREFIX)}
        if not own:
            raise ValueError(f"this checkpoint holds no reward model state: it was saved by "
                             f"a run without {FIELD}; resume it with the config it had")
        self.policy.load_state_dict({k: v for k, v in state.items()
                                     if not k.startswith(PREFIX)})
        self.model.load_state_dict(own)


class _GroupLearning:
    """DataParallel: both the policy and the model learn as one rank of a group."""

    policy: Any
    model: Any

    def set_reducer(self, reducer: Reducer | None) -> None:
        self.policy.set_reducer(reducer)
        self.model.set_reducer(reducer)


class _PassObsNorm:
    policy: Any

    @property
    def tracks_obs_stats(self) -> bool:
        return self.policy.tracks_obs_stats

    def preprocess(self, obs: np.ndarray) -> np.ndarray:
        return self.policy.preprocess(obs)

    def merge_obs_stats(self, moments: RunningMoments | Mapping[str, Any]) -> None:
        self.policy.merge_obs_stats(moments)


class _PassRng:
    policy: Any

    @property
    def rng(self) -> np.random.Generator:
        return self.policy.rng

    @rng.setter
    def rng(self, value: np.random.Generator) -> None:
        self.policy.rng = value


class _PassOptimizer:
    policy: Any

    @property
    def optimizer(self) -> Optimizer:
        return self.policy.optimizer


class _PassQValues:
    policy: Any

    def q_values(self, obs: torch.Tensor) -> torch.Tensor:
        return self.policy.q_values(obs)


class _PassEpsilon:
    policy: Any

    def epsilon(self, env_step: int) -> float:
        return self.policy.epsilon(env_step)

    def set_epsilon(self, epsilon: float | None) -> None:
        self.policy.set_epsilon(epsilon)


_PASSED_ON = ((NormalizesObservations, _PassObsNorm), (SeededActing, _PassRng),
              (Optimized, _PassOptimizer), (QValues, _PassQValues),
              (EpsilonGreedy, _PassEpsilon))


def with_reward_model(policy: Policy, algo_cfg: Any, spec: EnvSpec, seed: int) -> Policy:
    """`policy`, learning from the rewards of the config's reward model if it names one,
    with every capability the policy has (and `DataParallel` where both have it)."""
    if algo_cfg.reward_model is None:
        return policy
    model = make_reward_model(algo_cfg, spec, seed)
    bases: list[type] = [WithRewardModel]
    if isinstance(policy, DataParallel) and isinstance(model, DataParallel):
        bases.append(_GroupLearning)
    bases += [passer for cap, passer in _PASSED_ON if isinstance(policy, cap)]
    cls = type(f"WithRewardModel[{type(policy).__name__}]", tuple(bases), {})
    return cls(policy, model)
