"""Double DQN with a target network and Huber loss: the whole update, readable top to bottom.

This module knows batches of tensors and nothing of HTTP, Redis or files, so the same code
trains in the cluster and in the single-process runner that benchmarks it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from shared.config import DQNConfig
from shared.envs import EnvSpec
from shared.policies import QNetwork

BATCH_FIELDS = ("obs", "action", "reward", "next_obs", "terminated")


@dataclass
class UpdateResult:
    metrics: dict[str, torch.Tensor]
    td_abs: torch.Tensor  # |TD error| per item: the new priorities


def clip_grad_norm(params: list[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
    """Scale gradients so their global L2 norm is at most `max_norm`; returns the norm before
    scaling. The same result as `torch.nn.utils.clip_grad_norm_`, in two foreach kernels:
    on small CPU networks the library version's bookkeeping cost a third of each update."""
    grads = [p.grad for p in params if p.grad is not None]
    norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    torch._foreach_mul_(grads, torch.clamp(max_norm / (norm + 1e-6), max=1.0))
    return norm


class DQNLearner:
    def __init__(self, cfg: DQNConfig, spec: EnvSpec, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.cfg = cfg
        self.q = QNetwork(spec, cfg.hidden_sizes)
        self.target = QNetwork(spec, cfg.hidden_sizes)
        self.target.load_state_dict(self.q.state_dict())
        self.target.requires_grad_(False)
        # fused Adam: one kernel over all parameters, about 1.3x faster per update on CPU.
        self.optimizer = torch.optim.Adam(self.q.parameters(), lr=cfg.lr, fused=True)
        self.train_iterations = 0
        self._params = list(self.q.parameters())

    def update(self, batch: Mapping[str, torch.Tensor],
               weights: torch.Tensor | None = None) -> UpdateResult:
        """One gradient step on one batch. `weights` are importance-sampling weights from a
        prioritized buffer (None: all ones). Metrics stay 0-d tensors until reported:
        `.item()` on every step costs ~10% of the update."""
        obs, action = batch["obs"], batch["action"].long()
        reward, next_obs = batch["reward"], batch["next_obs"]
        not_done = 1.0 - batch["terminated"].float()

        # Double DQN target: the online net picks the next action, the target net values it.
        with torch.no_grad():
            next_action = self.q(next_obs).argmax(dim=1, keepdim=True)
            next_q = self.target(next_obs).gather(1, next_action).squeeze(1)
            target = reward + self.cfg.gamma * not_done * next_q

        q = self.q(obs).gather(1, action.unsqueeze(1)).squeeze(1)
        if weights is None:
            loss = F.smooth_l1_loss(q, target)
        else:
            loss = (weights * F.smooth_l1_loss(q, target, reduction="none")).mean()

        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = clip_grad_norm(self._params, self.cfg.max_grad_norm)
        self.optimizer.step()

        self.train_iterations += 1
        if self.train_iterations % self.cfg.target_update_every == 0:
            self.target.load_state_dict(self.q.state_dict())
        td_abs = (target - q.detach()).abs()
        return UpdateResult({"loss": loss.detach(), "q_mean": q.detach().mean(),
                             "grad_norm": grad_norm}, td_abs)

    def policy_state(self) -> dict[str, torch.Tensor]:
        """The weights collectors need (the online Q-network)."""
        return {k: v.detach().clone() for k, v in self.q.state_dict().items()}
