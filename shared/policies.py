"""Networks and acting for the algorithms collectors run. Training math lives in `learner/`;
this side only maps observations to actions, so collectors never import the learner."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch import nn

from shared.envs import EnvSpec


def mlp(in_dim: int, hidden: Sequence[int], out_dim: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    for h in hidden:
        layers += [nn.Linear(in_dim, h), nn.ReLU()]
        in_dim = h
    layers.append(nn.Linear(in_dim, out_dim))
    return nn.Sequential(*layers)


class QNetwork(nn.Module):
    def __init__(self, spec: EnvSpec, hidden: Sequence[int]) -> None:
        super().__init__()
        self.net = mlp(int(np.prod(spec.obs_shape)), hidden, spec.n_actions)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs.flatten(1))


class DQNPolicy:
    """Epsilon-greedy acting over a Q-network; `version` is the policy version it holds
    (-1 until the first published weights arrive)."""

    def __init__(self, spec: EnvSpec, hidden: Sequence[int], seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.spec = spec
        self.q = QNetwork(spec, hidden)
        self.q.eval()
        self.version = -1
        self.rng = np.random.default_rng(seed)

    def _greedy(self, obs: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            q = self.q(torch.as_tensor(obs, dtype=torch.float32))
        return q.argmax(dim=1).numpy()

    def act(self, obs: np.ndarray, epsilon: float) -> np.ndarray:
        n = obs.shape[0]
        explore = self.rng.random(n) < epsilon
        if explore.all():
            return self.rng.integers(self.spec.n_actions, size=n)
        actions = self._greedy(obs)
        if explore.any():
            actions[explore] = self.rng.integers(self.spec.n_actions, size=int(explore.sum()))
        return actions

    def act_eval(self, obs: np.ndarray) -> np.ndarray:
        return self._greedy(obs)

    def load(self, version: int, state: Mapping[str, torch.Tensor]) -> None:
        self.q.load_state_dict(state)
        self.version = version


def linear_epsilon(step: int, start: float, end: float, decay_steps: int) -> float:
    frac = min(max(step, 0) / decay_steps, 1.0)
    return start + frac * (end - start)
