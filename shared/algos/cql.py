"""Discrete CQL (Kumar et al. 2020, the CQL(H) variant): DQN's learning step plus a penalty.

Offline, a Q-network overrates the actions the dataset never took: nothing ever corrects
them, and the max in the target picks exactly those. CQL adds
`alpha * (logsumexp_a Q(s, a) - Q(s, a_data))` to the TD loss, which pushes every action's
value down and the dataset's action's back up, so the greedy policy stays on the data's
support. Everything else (double-DQN target, Huber loss, target copies, acting, checkpoints)
is `shared.algos.dqn.DQN`'s.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F

from shared.algos.base import LearnOutput
from shared.algos.dqn import DQN, masked_q
from shared.algos.nets import clip_grad_norm, sum_gradients
from shared.config import CQLConfig
from shared.envs import EnvSpec


class CQL(DQN):
    def __init__(self, cfg: CQLConfig, spec: EnvSpec, seed: int = 0) -> None:
        if not spec.discrete:
            raise ValueError(f"algo.name='cql' (discrete CQL) needs a discrete action space; "
                             f"this env has continuous actions of shape {spec.action_shape}")
        super().__init__(cfg, spec, seed)
        self.alpha = cfg.cql_alpha

    def learn(self, batch: Mapping[str, torch.Tensor],
              weights: torch.Tensor | None = None) -> LearnOutput:
        obs, action = batch["obs"], batch["action"].long()
        not_done = 1.0 - batch["terminated"].float()
        with torch.no_grad():
            next_obs = batch["next_obs"]
            next_action = masked_q(self.q(next_obs), batch.get("next_action_mask")).argmax(
                dim=1, keepdim=True)
            next_q = self.target(next_obs).gather(1, next_action).squeeze(1)
            target = batch["reward"] + self.cfg.gamma * not_done * next_q

        all_q = masked_q(self.q(obs), batch.get("action_mask"))
        q = all_q.gather(1, action.unsqueeze(1)).squeeze(1)
        td = F.smooth_l1_loss(q, target, reduction="none")
        gap = torch.logsumexp(all_q, dim=1) - q  # >= 0: how far the data's action lags
        per_item = td + self.alpha * gap
        loss = per_item.mean() if weights is None else (weights * per_item).mean()

        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.reducer is not None and self.reducer.world_size > 1:
            sum_gradients(self._params, self.reducer, scale=1.0 / self.reducer.world_size)
        grad_norm = clip_grad_norm(self._params, self.cfg.max_grad_norm)
        self.optimizer.step()

        self.train_iterations += 1
        if self.train_iterations % self.cfg.target_update_every == 0:
            self.target.load_state_dict(self.q.state_dict())
        return LearnOutput({"loss": loss.detach(), "td_loss": td.detach().mean(),
                            "cql_gap": gap.detach().mean(), "q_mean": q.detach().mean(),
                            "grad_norm": grad_norm}, (target - q.detach()).abs())
