"""Behaviour cloning: the policy that makes the dataset's actions most likely.

Discrete actions: a classifier over actions (cross-entropy); acting takes its argmax, or
samples it for the stochastic evaluation. Continuous actions: a regressor of the action
(squared error), squashed into the action box. The network is DQN's (an MLP, or the Nature
CNN over images), so a BC policy and a DQN policy read observations alike. Exploration has no
meaning offline: `act` is `act_eval(deterministic=False)`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from rlfleet.shared.algos.base import ActOutput, LearnOutput, Optimizer, Reducer
from rlfleet.shared.algos.bc.config import BCConfig
from rlfleet.shared.algos.dqn.policy import QNetwork, masked_q
from rlfleet.shared.algos.nets import (
    as_obs_tensor,
    clip_grad_norm,
    load_optimizer_state,
    optimizer_state,
    sum_gradients,
)
from rlfleet.shared.algos.optim import adam
from rlfleet.shared.contract.spec import EnvSpec


class BehaviourCloning:
    on_policy: ClassVar[bool] = False
    rng: np.random.Generator  # draws the stochastic evaluation's actions (SeededActing)

    def __init__(self, cfg: BCConfig, spec: EnvSpec, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.cfg = cfg
        self.spec = spec
        out = spec.n_actions if spec.discrete else int(np.prod(spec.action_shape))
        self.net = QNetwork(EnvSpec(spec.obs_shape, n_actions=out), cfg.hidden_sizes)
        if not spec.discrete:
            self.low = torch.as_tensor(spec.action_low, dtype=torch.float32)
            self.high = torch.as_tensor(spec.action_high, dtype=torch.float32)
        self._params = list(self.net.parameters())
        self._optimizer: Optimizer | None = None
        self.rng = np.random.default_rng(seed)
        self.version = -1
        self.train_iterations = 0
        self.reducer: Reducer | None = None

    @property
    def optimizer(self) -> Optimizer:
        if self._optimizer is None:  # only a learner steps it
            self._optimizer = adam(self.net.parameters(), lr=self.cfg.lr)
        return self._optimizer

    def set_reducer(self, reducer: Reducer | None) -> None:
        self.reducer = reducer

    def _action(self, out: torch.Tensor) -> torch.Tensor:
        """Continuous: the network's output squashed into [low, high]."""
        return self.low + (torch.tanh(out) + 1.0) * 0.5 * (self.high - self.low)

    # -- acting -----------------------------------------------------------------------------

    def act_eval(self, obs: np.ndarray, deterministic: bool = True,
                 mask: np.ndarray | None = None) -> np.ndarray:
        with torch.inference_mode():
            out = self.net(as_obs_tensor(obs))
            if not self.spec.discrete:
                return self._action(out).numpy()
            logits = masked_q(out, mask)
            if deterministic:
                return logits.argmax(dim=1).numpy()
            probs = torch.softmax(logits, dim=1).numpy().astype(np.float64)
            u = self.rng.random((probs.shape[0], 1))
            return np.minimum((probs.cumsum(axis=1) < u).sum(axis=1), probs.shape[1] - 1)

    def act(self, obs: np.ndarray, env_step: int, mask: np.ndarray | None = None
            ) -> ActOutput:
        return ActOutput(self.act_eval(obs, deterministic=False, mask=mask))

    def bootstrap(self, obs: np.ndarray) -> None:
        return None

    def load_policy(self, version: int, state: Mapping[str, torch.Tensor]) -> None:
        self.net.load_state_dict(state)
        self.version = version

    def policy_state(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.net.state_dict().items()}

    # -- learning ---------------------------------------------------------------------------

    def learn(self, batch: Mapping[str, torch.Tensor],
              weights: torch.Tensor | None = None) -> LearnOutput:
        out = self.net(batch["obs"])
        metrics: dict[str, torch.Tensor | float] = {}
        if self.spec.discrete:
            action = batch["action"].long().reshape(-1)
            per_item = F.cross_entropy(out, action, reduction="none")
            metrics["accuracy"] = (out.detach().argmax(dim=1) == action).float().mean()
        else:
            target = batch["action"].float().reshape(out.shape)
            per_item = ((self._action(out) - target) ** 2).flatten(1).sum(dim=1)
        loss = per_item.mean() if weights is None else (weights * per_item).mean()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.reducer is not None and self.reducer.world_size > 1:
            sum_gradients(self._params, self.reducer, scale=1.0 / self.reducer.world_size)
        metrics["grad_norm"] = clip_grad_norm(self._params, self.cfg.max_grad_norm)
        self.optimizer.step()
        self.train_iterations += 1
        metrics["loss"] = loss.detach()
        return LearnOutput(metrics, per_item.detach(), {"loss": per_item.detach()})

    # -- checkpoints ------------------------------------------------------------------------

    def state_dict(self) -> dict[str, torch.Tensor]:
        out = {f"net.{k}": v.detach().clone() for k, v in self.net.state_dict().items()}
        out.update(optimizer_state(self.optimizer))
        out["train_iterations"] = torch.tensor(self.train_iterations)
        return out

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        self.net.load_state_dict({k[4:]: v for k, v in state.items() if k.startswith("net.")})
        load_optimizer_state(self.optimizer, dict(state))
        self.train_iterations = int(state["train_iterations"])
