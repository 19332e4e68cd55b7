"""R2D2 (Kapturowski et al. 2019, "Recurrent Experience Replay in Distributed RL"): acting
and learning, top to bottom.

Acting: an MLP then an LSTM then the Q-values, one step per call, with a state per env that
`act` carries across calls (chunks and policy versions alike) and `reset_state` zeroes where
an episode ends. Each row's extras are the state the env acted from (`recurrent_h`,
`recurrent_c`), so the chunk stores it and a sequence can start from it. Epsilon-greedy as
DQN (Ape-X's per-collector epsilons included); evaluation has a state of its own.

Learning, from a batch of B sequences of L rows (a `sequence` buffer): rows after a sequence's
first `cut` belong to another run (padding) and are masked. Each sequence starts from its
stored state; its first `burn_in` rows only warm that state up (no gradient), for the online
and the target network each. The networks then unroll over obs[0], next_obs[0], ...,
next_obs[L-1]: within a run next_obs[t] is obs[t+1], so output t is Q(obs_t) and output t+1
is Q(next_obs_t), with the state of the sequence behind it, even at the run's last row (a
time limit or a chunk's end, which bootstraps). Targets are n-step double-Q sums inside the
sequence, in the value-rescaled space h; a sequence's loss is the mean over its learning
rows, weighted by its importance weight; its priority is eta x max + (1 - eta) x mean of
its |TD errors|.

In a learner group each rank holds an equal shard of the sequences: every loss is a mean
over sequences of per-sequence means, so averaging the ranks' gradients gives the step one
learner takes on the whole batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from rlfleet.shared.algos.base import RECURRENT_PREFIX, ActOutput, LearnOutput, Optimizer, Reducer
from rlfleet.shared.algos.device import FP32, Precision
from rlfleet.shared.algos.dqn.policy import QLearner, masked_q
from rlfleet.shared.algos.nets import (
    as_obs_tensor,
    mlp,
)
from rlfleet.shared.algos.r2d2.config import R2D2Config
from rlfleet.shared.contract.spec import EnvSpec

STATE_H, STATE_C = RECURRENT_PREFIX + "h", RECURRENT_PREFIX + "c"
State = tuple[torch.Tensor, torch.Tensor]  # (h, c), each (batch, lstm_size)


def rescale(x: torch.Tensor, eps: float) -> torch.Tensor:
    """R2D2's h(x) = sign(x)(sqrt(|x| + 1) - 1) + eps x: squashes large returns, so one
    network fits games whose rewards differ by orders of magnitude, with no clipping."""
    return torch.sign(x) * (torch.sqrt(x.abs() + 1.0) - 1.0) + eps * x


def unrescale(x: torch.Tensor, eps: float) -> torch.Tensor:
    """h's inverse, in closed form (Pohlen et al. 2018)."""
    root = (torch.sqrt(1.0 + 4.0 * eps * (x.abs() + 1.0 + eps)) - 1.0) / (2.0 * eps)
    return torch.sign(x) * (root * root - 1.0)


class RecurrentQNetwork(nn.Module):
    """Observations through an MLP (`hidden`), an LSTM of `lstm_size`, then Q-values."""

    def __init__(self, obs_dim: int, hidden: tuple[int, ...], lstm_size: int,
                 n_actions: int) -> None:
        super().__init__()
        self.encoder = nn.Sequential(mlp(obs_dim, hidden[:-1], hidden[-1]), nn.ReLU()) \
            if hidden else nn.Identity()
        self.lstm = nn.LSTM(hidden[-1] if hidden else obs_dim, lstm_size, batch_first=True)
        self.head = nn.Linear(lstm_size, n_actions)
        self.lstm_size = lstm_size

    def forward(self, obs: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """Q-values (B, T, A) over observations (B, T, obs_dim) from `state`, and the state
        after the last step."""
        # cuDNN's LSTM takes contiguous states only: a sequence's stored state is a slice
        out, (h, c) = self.lstm(self.encoder(obs.float()),
                                (state[0].unsqueeze(0).contiguous(),
                                 state[1].unsqueeze(0).contiguous()))
        return self.head(out), (h.squeeze(0), c.squeeze(0))

    def zero_state(self, n: int, device: torch.device) -> State:
        return (torch.zeros(n, self.lstm_size, device=device),
                torch.zeros(n, self.lstm_size, device=device))


def n_step_targets(reward: torch.Tensor, terminated: torch.Tensor, cut: torch.Tensor,
                   boot: torch.Tensor, gamma: float, n: int) -> torch.Tensor:
    """n-step targets for every row of (B, T) learning rows: up to n discounted rewards of
    the row's run, stopping after a cut or a terminal row and at the sequence's end, then
    gamma^m times `boot` (the value of next_obs) of the last row summed, unless it
    terminated. `boot` is in the return's space (unrescaled)."""
    B, T = reward.shape
    rows = torch.arange(T, device=reward.device).expand(B, T)
    total = torch.zeros_like(reward)
    discount = torch.ones_like(reward)
    last = rows
    alive = torch.ones_like(cut)
    for k in range(n):
        idx = rows + k
        alive = alive & (idx < T)
        if not alive.any():
            break
        idx = idx.clamp(max=T - 1)
        total = total + torch.where(alive, discount * reward.gather(1, idx), 0.0)
        discount = torch.where(alive, discount * gamma, discount)
        last = torch.where(alive, idx, last)
        alive = alive & ~cut.gather(1, idx) & ~terminated.gather(1, idx)
    not_done = 1.0 - terminated.gather(1, last).float()
    return total + discount * not_done * boot.gather(1, last)


class R2D2(QLearner):
    on_policy: ClassVar[bool] = False
    cfg: R2D2Config
    q: RecurrentQNetwork
    target: RecurrentQNetwork
    rng: np.random.Generator  # the acting stream (SeededActing)
    device: torch.device  # where its networks live (Placeable)

    def __init__(self, cfg: R2D2Config, spec: EnvSpec, seed: int = 0) -> None:
        if not spec.discrete:
            raise ValueError(f"algo.name='r2d2' needs a discrete action space; this env has "
                             f"continuous actions of shape {spec.action_shape}")
        if len(spec.obs_shape) != 1:
            raise ValueError(f"algo.name='r2d2' supports flat observations only; this env's "
                             f"are {spec.obs_shape}")
        torch.manual_seed(seed)
        self.cfg = cfg
        self.spec = spec
        args = (spec.obs_shape[0], tuple(cfg.hidden_sizes), cfg.lstm_size, spec.n_actions)
        self.q = RecurrentQNetwork(*args)
        self.target = RecurrentQNetwork(*args)
        self.target.load_state_dict(self.q.state_dict())
        self.target.requires_grad_(False)
        self._params = list(self.q.parameters())
        self._optimizer: Optimizer | None = None
        self.rng = np.random.default_rng(seed)
        self.version = -1
        self.train_iterations = 0
        self.reducer: Reducer | None = None
        self.device = torch.device("cpu")
        self.precision: Precision = FP32
        self.fixed_epsilon: float | None = None
        # acting's and evaluation's states, one row per env, made at the first call
        self._states: dict[bool, State | None] = {False: None, True: None}

    def to(self, device: torch.device) -> None:
        """Both networks, the states and any optimizer state on `device` (Placeable)."""
        self.device = torch.device(device)
        self.q.to(self.device)
        self.target.to(self.device)
        self._states = {k: None if s is None else (s[0].to(self.device), s[1].to(self.device))
                        for k, s in self._states.items()}
        if self._optimizer is not None:
            self._optimizer.load_state_dict(self._optimizer.state_dict())

    # -- acting -----------------------------------------------------------------------------

    def reset_state(self, envs: np.ndarray | None = None, evaluation: bool = False) -> None:
        """Zero these envs' state (None: forget every env's) (Recurrent)."""
        state = self._states[evaluation]
        if envs is None or state is None:
            self._states[evaluation] = None
            return
        idx = torch.as_tensor(np.asarray(envs, dtype=np.int64), device=self.device)
        state[0][idx] = 0.0
        state[1][idx] = 0.0

    def _forward(self, obs: np.ndarray, evaluation: bool) -> tuple[torch.Tensor, State]:
        """Q-values of one step for every env, advancing that side's state; returns the
        state the envs acted from."""
        n = obs.shape[0]
        state = self._states[evaluation]
        if state is None or state[0].shape[0] != n:
            state = self.q.zero_state(n, self.device)
        with torch.no_grad():  # not inference mode: reset_state writes into the state
            q, after = self.q(as_obs_tensor(obs, self.device).unsqueeze(1), state)
        self._states[evaluation] = after
        return q[:, 0], state

    def _choose(self, q: torch.Tensor, epsilon: float, mask: np.ndarray | None) -> np.ndarray:
        actions = masked_q(q, mask).argmax(dim=1).cpu().numpy()
        n: int = actions.shape[0]
        explore = self.rng.random(n) < epsilon
        if explore.any():
            if mask is None:
                actions[explore] = self.rng.integers(self.spec.n_actions,
                                                     size=int(explore.sum()))
            else:
                scores = np.where(mask[explore], self.rng.random(mask[explore].shape), -1.0)
                actions[explore] = scores.argmax(axis=1)
        return actions

    def act(self, obs: np.ndarray, env_step: int, mask: np.ndarray | None = None
            ) -> ActOutput:
        q, before = self._forward(obs, evaluation=False)
        actions = self._choose(q, self.epsilon(env_step), mask)
        return ActOutput(actions, {STATE_H: before[0].cpu().numpy(),
                                   STATE_C: before[1].cpu().numpy()})

    def act_eval(self, obs: np.ndarray, deterministic: bool = True,
                 mask: np.ndarray | None = None) -> np.ndarray:
        q, _ = self._forward(obs, evaluation=True)
        return self._choose(q, 0.0 if deterministic else self.cfg.eval_epsilon, mask)

    def bootstrap(self, obs: np.ndarray) -> None:
        return None  # targets bootstrap from next_obs in the learner

    def load_policy(self, version: int, state: Mapping[str, torch.Tensor]) -> None:
        self.q.load_state_dict(state)  # the envs' states go on: R2D2's actors keep them
        self.version = version

    def policy_state(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.q.state_dict().items()}

    # -- learning ---------------------------------------------------------------------------

    def learn(self, batch: Mapping[str, torch.Tensor],
              weights: torch.Tensor | None = None) -> LearnOutput:
        """One gradient step on B sequences of L rows; priorities: one per sequence."""
        cfg = self.cfg
        cut = batch["cut"].bool()
        B, L = cut.shape
        burn = min(cfg.burn_in, L - 1)
        # row t is the sequence's own while no cut came before it
        valid = (torch.cumsum(cut.int(), 1) - cut.int()) == 0
        inputs = torch.cat([batch["obs"][:, :1], batch["next_obs"]], 1)  # (B, L + 1, D)
        start = (batch[STATE_H][:, 0].float(), batch[STATE_C][:, 0].float())
        with self.precision.autocast():
            with torch.no_grad():
                online_start, target_start = start, start
                if burn:
                    _, online_start = self.q(inputs[:, :burn], start)
                    _, target_start = self.target(inputs[:, :burn], start)
                target_q, _ = self.target(inputs[:, burn:], target_start)
            online_q, _ = self.q(inputs[:, burn:], online_start)  # (B, L + 1 - burn, A)
        online_q, target_q = online_q.float(), target_q.float()
        action = batch["action"][:, burn:].long()
        q = online_q[:, :-1].gather(2, action.unsqueeze(2)).squeeze(2)  # (B, T)
        with torch.no_grad():
            next_action = online_q[:, 1:].argmax(dim=2, keepdim=True)
            boot = target_q[:, 1:].gather(2, next_action).squeeze(2)
            if cfg.value_rescaling:
                boot = unrescale(boot, cfg.rescale_eps)
            target = n_step_targets(batch["reward"][:, burn:].float(),
                                    batch["terminated"][:, burn:].bool(), cut[:, burn:],
                                    boot, cfg.gamma, cfg.n_step)
            if cfg.value_rescaling:
                target = rescale(target, cfg.rescale_eps)
        mask = valid[:, burn:].float()
        rows = mask.sum(1).clamp(min=1.0)
        per_sequence = (F.smooth_l1_loss(q, target, reduction="none") * mask).sum(1) / rows
        loss = per_sequence.mean() if weights is None else (weights * per_sequence).mean()
        grad_norm = self._step(loss)
        td = (target - q.detach()).abs() * mask
        priorities = cfg.priority_eta * td.max(1).values \
            + (1.0 - cfg.priority_eta) * td.sum(1) / rows
        return LearnOutput({"loss": loss.detach(), "q_mean": (q.detach() * mask).sum() /
                            mask.sum().clamp(min=1.0), "grad_norm": grad_norm,
                            "valid_fraction": valid.float().mean()}, priorities,
                           {"td_error": td.sum(1) / rows, "loss": per_sequence.detach()})
