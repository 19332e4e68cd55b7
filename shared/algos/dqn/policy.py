"""Double DQN with a target network and Huber loss: acting and learning, top to bottom.

Acting is epsilon-greedy, epsilon decaying linearly over the run's global env steps, or
fixed per collector (`set_epsilon`: Ape-X's `collector.epsilon_schedule: apex`); evaluation
is greedy (deterministic) or epsilon-greedy with `eval_epsilon` (stochastic).

Games with illegal moves pass an action mask: acting (greedy and random alike) only picks
legal actions, and the target's max runs over the next state's legal actions
(`next_action_mask`), so Q-values of moves that cannot be made never leak into targets.

In a learner group each rank holds an equal shard of the batch; averaging the ranks' gradients
of their shard means is the gradient of the whole batch's mean, so the step (clipping
included, since it runs after the average) is the one a single learner would take.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar, Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from rlfleet.shared.algos.base import ActOutput, LearnOutput, Optimizer, Reducer
from rlfleet.shared.algos.device import FP32, Precision
from rlfleet.shared.algos.dqn.config import DQNConfig
from rlfleet.shared.algos.nets import (
    NatureCNN,
    as_obs_tensor,
    clip_grad_norm,
    load_optimizer_state,
    mlp,
    optimizer_state,
    sum_gradients,
)
from rlfleet.shared.algos.optim import adam
from rlfleet.shared.contract.spec import EnvSpec, is_image


class QNetwork(nn.Module):
    """An MLP over flat observations; over images (C, H, W), the Nature DQN: its CNN trunk
    and one linear layer to the Q-values (`hidden` is then unused)."""

    def __init__(self, spec: EnvSpec, hidden: tuple[int, ...]) -> None:
        super().__init__()
        self.image = is_image(spec.obs_shape)
        if self.image:
            trunk = NatureCNN(spec.obs_shape)
            self.net = nn.Sequential(trunk, nn.Linear(trunk.features, spec.n_actions))
        else:
            self.net = mlp(int(np.prod(spec.obs_shape)), hidden, spec.n_actions)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs if self.image else obs.flatten(1).float())


def masked_q(q: torch.Tensor, mask: torch.Tensor | np.ndarray | None) -> torch.Tensor:
    """Q-values with illegal actions at -inf (rows without a legal action, a finished game's
    next state, are left as they are: their target is cut by `terminated` anyway)."""
    if mask is None:
        return q
    legal = torch.as_tensor(mask, dtype=torch.bool, device=q.device)
    legal = legal | ~legal.any(dim=1, keepdim=True)
    return q.masked_fill(~legal, float("-inf"))


def linear_epsilon(step: int, start: float, end: float, decay_steps: int) -> float:
    frac = min(max(step, 0) / decay_steps, 1.0)
    return start + frac * (end - start)


class QSettings(Protocol):
    """What QLearner reads of its algorithm's config (DQNConfig's and R2D2Config's fields)."""

    @property
    def lr(self) -> float: ...
    @property
    def max_grad_norm(self) -> float: ...
    @property
    def target_update_every(self) -> int: ...
    @property
    def eps_start(self) -> float: ...
    @property
    def eps_end(self) -> float: ...
    @property
    def eps_decay_steps(self) -> int: ...


class QLearner:
    """What DQN and R2D2 share: an online and a target Q-network stepped by one optimizer
    (made on first use), epsilon-greedy acting with a linear decay or a fixed epsilon
    (EpsilonGreedy), one gradient step with a group's all-reduce and the target's copy,
    and checkpoints of both networks and the optimizer. A subclass sets `cfg`, `q`,
    `target`, `_params`, `_optimizer`, `precision`, `reducer`, `fixed_epsilon` and
    `train_iterations`."""

    cfg: QSettings
    q: nn.Module
    target: nn.Module
    _params: list[nn.Parameter]
    _optimizer: Optimizer | None
    precision: Precision
    reducer: Reducer | None
    fixed_epsilon: float | None
    train_iterations: int

    @property
    def optimizer(self) -> Optimizer:
        """Made on first use: only a learner ever steps it (`shared/algos/optim.py`)."""
        if self._optimizer is None:
            self._optimizer = adam(self.q.parameters(), lr=self.cfg.lr)
        return self._optimizer

    @optimizer.setter
    def optimizer(self, optimizer: Optimizer) -> None:
        """A subclass may bring its own (for a network of its own)."""
        self._optimizer = optimizer

    def set_precision(self, precision: Precision) -> None:
        """Learn under `learner.precision` (MixedPrecision)."""
        self.precision = precision

    def set_reducer(self, reducer: Reducer | None) -> None:
        """Learn as one rank of a data-parallel group (None: alone)."""
        self.reducer = reducer

    def epsilon(self, env_step: int) -> float:
        """The fixed epsilon if one was set, else the linear decay at this env step of the
        run (EpsilonGreedy)."""
        if self.fixed_epsilon is not None:
            return self.fixed_epsilon
        c = self.cfg
        return linear_epsilon(env_step, c.eps_start, c.eps_end, c.eps_decay_steps)

    def set_epsilon(self, epsilon: float | None) -> None:
        """Act with this fixed epsilon (an Ape-X collector's), or None: the decay
        (EpsilonGreedy)."""
        if epsilon is not None and not 0.0 <= epsilon <= 1.0:
            raise ValueError(f"epsilon {epsilon} is not a probability")
        self.fixed_epsilon = None if epsilon is None else float(epsilon)

    def _step(self, loss: torch.Tensor) -> torch.Tensor:
        """One gradient step on `loss` (averaged over a learner group's ranks), and the
        target network's copy when it is due; returns the gradient norm before clipping."""
        self.optimizer.zero_grad(set_to_none=True)
        self.precision.backward(loss)
        if self.reducer is not None and self.reducer.world_size > 1:
            sum_gradients(self._params, self.reducer, scale=1.0 / self.reducer.world_size)
        self.precision.unscale(self.optimizer)
        grad_norm = clip_grad_norm(self._params, self.cfg.max_grad_norm)
        self.precision.step(self.optimizer)
        self.train_iterations += 1
        if self.train_iterations % self.cfg.target_update_every == 0:
            self.target.load_state_dict(self.q.state_dict())
        return grad_norm

    # -- checkpoints ------------------------------------------------------------------------

    def state_dict(self) -> dict[str, torch.Tensor]:
        out = {f"q.{k}": v.detach().clone() for k, v in self.q.state_dict().items()}
        out.update({f"target.{k}": v.detach().clone()
                    for k, v in self.target.state_dict().items()})
        out.update(optimizer_state(self.optimizer))
        out["train_iterations"] = torch.tensor(self.train_iterations)
        return out

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        self.q.load_state_dict({k[2:]: v for k, v in state.items() if k.startswith("q.")})
        self.target.load_state_dict({k[7:]: v for k, v in state.items()
                                     if k.startswith("target.")})
        load_optimizer_state(self.optimizer, dict(state))
        self.train_iterations = int(state["train_iterations"])


class DQN(QLearner):
    on_policy: ClassVar[bool] = False
    cfg: DQNConfig
    q: QNetwork
    target: QNetwork
    rng: np.random.Generator  # the acting stream (SeededActing)
    device: torch.device  # where its networks live (Placeable)

    def __init__(self, cfg: DQNConfig, spec: EnvSpec, seed: int = 0) -> None:
        if not spec.discrete:
            raise ValueError(f"algo.name='dqn' needs a discrete action space; this env has "
                             f"continuous actions of shape {spec.action_shape}")
        if cfg.her is not None and spec.goal is None:
            raise ValueError("algo.her needs a goal-conditioned env (observations "
                             "Dict(observation, achieved_goal, desired_goal))")
        torch.manual_seed(seed)
        self.cfg = cfg
        self.spec = spec
        self.q = QNetwork(spec, cfg.hidden_sizes)
        self.target = QNetwork(spec, cfg.hidden_sizes)
        self.target.load_state_dict(self.q.state_dict())
        self.target.requires_grad_(False)
        self._optimizer: Optimizer | None = None  # see `optimizer`
        self._params = list(self.q.parameters())
        self.rng = np.random.default_rng(seed)
        self.version = -1
        self.train_iterations = 0
        self.reducer: Reducer | None = None
        self.device = torch.device("cpu")
        self.precision: Precision = FP32
        self.fixed_epsilon: float | None = None  # set_epsilon (EpsilonGreedy)

    def to(self, device: torch.device) -> None:
        """Both networks, and any optimizer state, on `device` (Placeable)."""
        self.device = torch.device(device)
        self.q.to(self.device)
        self.target.to(self.device)
        if self._optimizer is not None:  # its state follows the parameters it loads into
            self._optimizer.load_state_dict(self._optimizer.state_dict())

    # -- acting -----------------------------------------------------------------------------

    def _greedy(self, obs: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        with torch.inference_mode():
            q = self.q(as_obs_tensor(obs, self.device))
            return masked_q(q, mask).argmax(dim=1).cpu().numpy()

    def _random(self, n: int, mask: np.ndarray | None) -> np.ndarray:
        if mask is None:
            return self.rng.integers(self.spec.n_actions, size=n)
        # A uniform legal action per row: the largest of random scores over legal actions.
        scores = np.where(mask, self.rng.random(mask.shape), -1.0)
        return scores.argmax(axis=1)

    def _epsilon_greedy(self, obs: np.ndarray, epsilon: float,
                        mask: np.ndarray | None = None) -> np.ndarray:
        n: int = obs.shape[0]
        explore = self.rng.random(n) < epsilon
        if explore.all():
            return self._random(n, mask)
        actions = self._greedy(obs, mask)
        if explore.any():
            actions[explore] = self._random(int(explore.sum()),
                                            None if mask is None else mask[explore])
        return actions

    def act(self, obs: np.ndarray, env_step: int, mask: np.ndarray | None = None
            ) -> ActOutput:
        return ActOutput(self._epsilon_greedy(obs, self.epsilon(env_step), mask))

    def act_eval(self, obs: np.ndarray, deterministic: bool = True,
                 mask: np.ndarray | None = None) -> np.ndarray:
        if deterministic:
            return self._greedy(obs, mask)
        return self._epsilon_greedy(obs, self.cfg.eval_epsilon, mask)

    def bootstrap(self, obs: np.ndarray) -> None:
        return None  # one-step targets come from next_obs in the learner

    def q_values(self, obs: torch.Tensor) -> torch.Tensor:
        """Q(s, .) of the online network, without gradients (QValues)."""
        with torch.inference_mode():
            return self.q(obs.to(self.device))

    def load_policy(self, version: int, state: Mapping[str, torch.Tensor]) -> None:
        self.q.load_state_dict(state)
        self.version = version

    def policy_state(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.q.state_dict().items()}

    # -- learning ---------------------------------------------------------------------------

    def learn(self, batch: Mapping[str, torch.Tensor],
              weights: torch.Tensor | None = None) -> LearnOutput:
        """One gradient step. `weights` are importance-sampling weights from a prioritized
        buffer (None: all ones); the new priorities are |TD error|."""
        with self.precision.autocast():
            all_q = self.q(batch["obs"])
            q, target = self._q_and_target(all_q, batch)
        q, target = q.float(), target.float()
        if weights is None:
            loss = F.smooth_l1_loss(q, target)
        else:
            loss = (weights * F.smooth_l1_loss(q, target, reduction="none")).mean()
        grad_norm = self._step(loss)
        td_abs = (target - q.detach()).abs()
        return LearnOutput({"loss": loss.detach(), "q_mean": q.detach().mean(),
                            "grad_norm": grad_norm}, td_abs,
                           {"td_error": td_abs, "q": q.detach()})

    def _q_and_target(self, all_q: torch.Tensor, batch: Mapping[str, torch.Tensor]
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """Q(s, a) of the batch's actions, and their double-DQN targets (no gradient): the
        online net picks the next action, the target net values it. With n-step returns
        (`algo.n_step`) `reward` is the discounted sum of up to n rewards, `next_obs` the
        observation after the last of them and `discount` gamma^m per row (m: the rewards
        summed), which bootstraps in place of gamma."""
        not_done = 1.0 - batch["terminated"].float()
        next_obs = batch["next_obs"]
        discount = batch.get("discount")
        with torch.no_grad():
            next_action = masked_q(self.q(next_obs), batch.get("next_action_mask")).argmax(
                dim=1, keepdim=True)
            next_q = self.target(next_obs).gather(1, next_action).squeeze(1)
            target = batch["reward"] + (self.cfg.gamma if discount is None else discount) \
                * not_done * next_q
        q = all_q.gather(1, batch["action"].long().unsqueeze(1)).squeeze(1)
        return q, target
