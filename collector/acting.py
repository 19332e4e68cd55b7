"""What acts in a collector: uniform random actions while torch loads, where the algorithm
allows it, then the run's policy, kept at the newest published version.

Where the algorithm would itself act uniformly at random at the run's start
(`random_warmup_steps`: the built-in DQN from epsilon 1, before its first update), the loop
does not wait for torch (`collector/torch_loader.py`): it acts uniformly at random, its
chunks saying policy version -1 (no published policy acted), until torch and the real policy
are there, as SB3's and Dopamine's random warm-up steps do. Anything else (PPO: its chunks
carry the acting policy's log-probs) waits for torch.

An Ape-X collector (`collector.epsilon_schedule: apex`) acts with the fixed epsilon its
collect task brings (its slot's) from its first step to its last: the policy gets it once,
as it is made (`EpsilonGreedy.set_epsilon`), and the algorithm allows no random warm-up.

A storage outage never stops acting: a policy check that fails keeps the policy at hand
until storage answers again.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import numpy as np

from rlfleet.collector.counters import CollectorCounters
from rlfleet.collector.torch_loader import TorchLoader
from rlfleet.shared.algos.base import ActOutput, Policy
from rlfleet.shared.algos.capabilities import EpsilonGreedy
from rlfleet.shared.algos.registry import algo_spec, make_policy
from rlfleet.shared.contract.spec import EnvSpec
from rlfleet.shared.envs.make import run_spec
from rlfleet.shared.infra.storage import Storage, StorageError
from rlfleet.shared.run.config import RunConfig

if TYPE_CHECKING:
    from rlfleet.collector.weights import StorageWeightSource

log = logging.getLogger("rlfleet.collector")


def random_warmup_steps(cfg: RunConfig) -> int:
    """Env steps of the run (all collectors' together) during which a collector may act
    uniformly at random instead of waiting for torch: what the algorithm's spec says its
    own behaviour is then (`AlgoSpec.warmup`). 0 for a user's policy (its behaviour is
    unknown) and in a game (random moves must be legal ones: the policy masks)."""
    if cfg.algo.policy or cfg.league is not None:
        return 0
    return algo_spec(cfg.algo.name).warmup(cfg)


class RandomPolicy:
    """Uniform random actions, as no published policy (version -1): what a DQN or SAC
    collector acts with while torch loads (`random_warmup_steps`): one of the discrete
    actions, or a point of the continuous Box [low, high] (float32, as a policy's). Only
    `act` and `bootstrap` are ever called on it; evaluation waits for the real policy."""

    on_policy = False
    version = -1
    train_iterations = 0

    def __init__(self, spec: EnvSpec, seed: int) -> None:
        self.n_actions = spec.n_actions
        self.rng = np.random.default_rng(seed)
        if not spec.discrete:
            shape = tuple(spec.action_shape)
            self.low = np.asarray(spec.action_low, dtype=np.float32).reshape(shape)
            self.high = np.asarray(spec.action_high, dtype=np.float32).reshape(shape)
            if not (np.isfinite(self.low).all() and np.isfinite(self.high).all()):
                raise ValueError("uniform random warm-up needs a bounded action space; got "
                                 f"low {spec.action_low}, high {spec.action_high}")

    def act(self, obs: np.ndarray, env_step: int) -> ActOutput:
        n: int = obs.shape[0]
        if self.n_actions:
            return ActOutput(self.rng.integers(self.n_actions, size=n))
        return ActOutput(self.rng.uniform(self.low, self.high, size=(n, *self.low.shape))
                         .astype(np.float32))

    def bootstrap(self, obs: np.ndarray) -> None:
        return None


class PolicyRefresher:
    """Loads newer published weights into the acting policy and counts what it loaded.

    A check that fails (storage is down) leaves the policy as it is and says so once per
    outage, not once per chunk; the next check that gets an answer says storage is back."""

    def __init__(self, counters: CollectorCounters) -> None:
        self.counters = counters
        self._storage_out = False  # the last check failed: the outage is already logged

    def refresh(self, policy: Policy, weights: StorageWeightSource,
                force: bool = False) -> None:
        """Load the newest version if it is newer than `policy`'s; `force` looks now, not
        only once the weight source's interval since its last look has passed."""
        try:
            got = weights.poll(policy.version, force=force)
        except StorageError as err:
            if not self._storage_out:
                log.warning("cannot check for a newer policy (going on with version %d "
                            "until storage answers): %s", policy.version, err)
            self._storage_out = True
            return
        if self._storage_out:
            log.info("storage answers again: policy checks resume")
            self._storage_out = False
        if got is not None:
            policy.load_policy(*got)
            self.counters.policy_version = policy.version
            self.counters.policy_loads += 1


class Acting:
    """The policy the collect loop acts with, and where its weights come from.

    `policy` starts as a `RandomPolicy` where the algorithm allows a random warm-up and torch
    is not there yet, else as None (nothing may act: the loop waits for torch). `make_real`
    replaces it with the run's policy and its weight source, once; from then on `real` is
    True and `refresh` keeps the policy at the newest published version."""

    def __init__(self, cfg: RunConfig, seed: int, storage: Storage, torch: TorchLoader,
                 refresher: PolicyRefresher, counters: CollectorCounters,
                 fixed_epsilon: float | None = None, apex_slot: int | None = None) -> None:
        self.cfg = cfg
        self.spec = run_spec(cfg)
        self.seed = seed
        # Ape-X: the collect task's slot and its epsilon, for as long as this loop runs
        self.fixed_epsilon = fixed_epsilon
        self.apex_slot = apex_slot
        counters.apex_slot = apex_slot
        self.storage = storage
        self.torch = torch
        self.refresher = refresher
        self.counters = counters
        self.warmup_steps = random_warmup_steps(cfg)
        self.policy: Policy | RandomPolicy | None = (
            RandomPolicy(self.spec, seed) if self.warmup_steps and not torch.ready.is_set()
            else None)
        self.weights: StorageWeightSource | None = None
        self.device: Any = None  # where the run's policy acts, once made (collector.device)

    @property
    def real(self) -> bool:
        """Whether the run's policy acts (and evaluations may run)."""
        return self.weights is not None

    def wants_real(self, evaluations_waiting: bool, run_env_steps: int) -> bool:
        """Whether the run's policy should act now: nothing else may act, torch is there
        anyway, an evaluation needs it, or the run (`run_env_steps`, all collectors') or this
        collector alone is past the random warm-up."""
        return not self.real and (self.policy is None or self.torch.ready.is_set()
                                  or evaluations_waiting
                                  or run_env_steps >= self.warmup_steps
                                  or self.counters.random_steps >= self.warmup_steps)

    def make_real(self, timeout: float) -> bool:
        """Make the run's policy and its weight source, waiting up to `timeout` for torch;
        False while torch is still loading (the caller looks at closing, then asks again)."""
        if not self.torch.wait(timeout):
            return False
        import torch

        from rlfleet.collector.weights import StorageWeightSource
        from rlfleet.shared.algos.device import place_policy

        torch.set_num_threads(1)  # this thread acts: say it here too, not only on the loader's
        self.weights = StorageWeightSource(self.storage,
                                           self.cfg.collector.policy_check_interval_s)
        self.policy = make_policy(self.cfg.algo, self.spec, self.seed)
        # collector.device: a conv net over many envs may act faster on a GPU
        self.device = place_policy(self.policy, self.cfg.collector.device, "collector.device")
        if self.fixed_epsilon is not None:
            if not isinstance(self.policy, EpsilonGreedy):
                raise ValueError(f"collector.epsilon_schedule=apex gives this collector the "
                                 f"fixed epsilon {self.fixed_epsilon:.6g}, but its "
                                 f"{type(self.policy).__name__} is not EpsilonGreedy (it has "
                                 "no epsilon and set_epsilon)")
            self.policy.set_epsilon(self.fixed_epsilon)
            self.counters.epsilon = self.fixed_epsilon
            log.info("Ape-X slot %s: acting with the fixed epsilon %.6g", self.apex_slot,
                     self.fixed_epsilon)
        return True

    def epsilon(self, env_step: int) -> float | None:
        """The epsilon acting explores with at this env step of the run: 1 while random
        warm-up acts, the policy's own where it is `EpsilonGreedy`, else None."""
        policy = self.policy
        if isinstance(policy, RandomPolicy):
            return 1.0
        if isinstance(policy, EpsilonGreedy):
            return float(policy.epsilon(env_step))
        return None

    def refresh(self, force: bool = False) -> None:
        """Bring the run's policy to the newest published version (nothing before
        `make_real`: random actions have no weights)."""
        if self.weights is not None:
            assert self.policy is not None and not isinstance(self.policy, RandomPolicy)
            self.refresher.refresh(self.policy, self.weights, force)

    def for_evaluation(self, version: int) -> Policy:
        """The run's policy for an evaluation of `version`, refreshed now where it is older:
        the evaluation task may come before this collector's own check saw that version."""
        policy = self.policy
        assert self.real and policy is not None and not isinstance(policy, RandomPolicy), \
            "evaluations wait for the run's policy"
        if policy.version < version:
            self.refresh(force=True)
        return policy

    def acted(self, env_steps: int) -> None:
        """Count `env_steps` just acted, as random warm-up steps if `RandomPolicy` acted."""
        if isinstance(self.policy, RandomPolicy):
            self.counters.random_steps += env_steps
