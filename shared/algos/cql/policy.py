"""Discrete CQL (Kumar et al. 2020, the CQL(H) variant): DQN's learning step plus a penalty.

Offline, a Q-network overrates the actions the dataset never took: nothing ever corrects
them, and the max in the target picks exactly those. CQL adds
`alpha * (logsumexp_a Q(s, a) - Q(s, a_data))` to the TD loss, which pushes every action's
value down and the dataset's action's back up, so the greedy policy stays on the data's
support. Everything else (double-DQN target, Huber loss, target copies, acting, checkpoints)
is DQN's (`shared/algos/dqn/policy.py`).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F

from rlfleet.shared.algos.base import LearnOutput
from rlfleet.shared.algos.cql.config import CQLConfig
from rlfleet.shared.algos.dqn.policy import DQN, masked_q
from rlfleet.shared.contract.spec import EnvSpec


class CQL(DQN):
    def __init__(self, cfg: CQLConfig, spec: EnvSpec, seed: int = 0) -> None:
        if not spec.discrete:
            raise ValueError(f"algo.name='cql' (discrete CQL) needs a discrete action space; "
                             f"this env has continuous actions of shape {spec.action_shape}")
        super().__init__(cfg, spec, seed)
        self.alpha = cfg.cql_alpha

    def learn(self, batch: Mapping[str, torch.Tensor],
              weights: torch.Tensor | None = None) -> LearnOutput:
        with self.precision.autocast():
            all_q = masked_q(self.q(batch["obs"]), batch.get("action_mask"))
            q, target = self._q_and_target(all_q, batch)
        all_q, q, target = all_q.float(), q.float(), target.float()
        td = F.smooth_l1_loss(q, target, reduction="none")
        gap = torch.logsumexp(all_q, dim=1) - q  # >= 0: how far the data's action lags
        per_item = td + self.alpha * gap
        loss = per_item.mean() if weights is None else (weights * per_item).mean()
        grad_norm = self._step(loss)
        td_abs = (target - q.detach()).abs()
        return LearnOutput({"loss": loss.detach(), "td_loss": td.detach().mean(),
                            "cql_gap": gap.detach().mean(), "q_mean": q.detach().mean(),
                            "grad_norm": grad_norm}, td_abs,
                           {"td_error": td_abs, "cql_gap": gap.detach(), "q": q.detach()})
