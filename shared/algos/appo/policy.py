"""APPO (asynchronous PPO, as in Sample Factory and RLlib) and IMPALA on V-trace.

PPO (`shared/algos/ppo/policy.py`) learns from rollouts acted by the last few versions and
drops older chunks; here every chunk is learned from, however old its policy, because the
targets correct for the gap. Each learn round first runs the learning network over the rollout
once without gradients: its values V(x), its log-probs of the actions taken, and V of the
observation each run stopped at. V-trace (`vtrace.py`) turns them, with the behaviour
policy's log-probs the collectors stored, into value targets and advantages. The minibatch
updates are PPO's: the clipped surrogate of pi/mu on those advantages, or with `impala` the
plain policy gradient -A log pi whose advantages carry the truncated importance weight.

Everything else (networks, acting, observation normalisation, learner groups, devices,
precision, checkpoints) is PPO's. In a learner group each rank computes V-trace on its own
chunks: a run never spans two chunks, so the targets are the same as one learner's.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from rlfleet.shared.algos.appo.config import APPOConfig
from rlfleet.shared.algos.appo.vtrace import vtrace
from rlfleet.shared.algos.nets import as_obs_tensor
from rlfleet.shared.algos.ppo.policy import PPO
from rlfleet.shared.contract.spec import EnvSpec

EVAL_ROWS = 4096  # rows per no-gradient pass over a rollout (bounds an Atari rollout's memory)


class APPO(PPO):
    cfg: APPOConfig

    def __init__(self, cfg: APPOConfig, spec: EnvSpec, seed: int = 0) -> None:
        if cfg.c_bar > cfg.rho_bar:
            raise ValueError(f"algo.c_bar={cfg.c_bar} must be at most algo.rho_bar="
                             f"{cfg.rho_bar} (V-trace's traces truncate no later than its "
                             "TD errors)")
        super().__init__(cfg, spec, seed)

    @torch.no_grad()
    def _evaluate(self, obs: torch.Tensor, action: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        """The learning network's V(x) and log pi(a|x) over rows, in slices."""
        values, log_probs = [], []
        for start in range(0, obs.shape[0], EVAL_ROWS):
            o = as_obs_tensor(obs[start:start + EVAL_ROWS])
            with self.precision.autocast():
                head, value = self.net.head_value(o)
                log_prob, _ = self.net.log_prob_entropy(
                    head, action[start:start + EVAL_ROWS])
            values.append(value.float())
            log_probs.append(log_prob.float())
        return torch.cat(values), torch.cat(log_probs)

    @torch.no_grad()
    def _bootstrap(self, batch: Mapping[str, torch.Tensor], cut: np.ndarray,
                   terminated: np.ndarray) -> np.ndarray:
        """V of the observation each run stopped at, by the learning network (0 where
        the run terminated): a truncated episode or a chunk's end bootstraps from it."""
        out = np.zeros(cut.shape[0], dtype=np.float32)
        need = np.flatnonzero(cut & ~terminated)
        if need.size == 0:
            return out
        if "next_obs" in batch:
            rows = torch.from_numpy(need).to(self.device)
            value, _ = self._evaluate(batch["next_obs"][rows], batch["action"][rows])
            out[need] = value.cpu().numpy()
        else:  # a custom rollout without next_obs: the collectors' bootstrap values
            out[need] = batch["bootstrap_value"].cpu().numpy()[need]
        return out

    def _targets(self, batch: Mapping[str, torch.Tensor], old_value: torch.Tensor, rows: int
                 ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor | float]]:
        """V-trace value targets and advantages under the learning network; the mean
        truncated importance weight and the share of weights truncated as metrics."""
        c = self.cfg
        if not rows:
            empty = torch.zeros(0, device=self.device)
            return empty, empty, {}
        action = batch["action"] if self.spec.discrete else batch["action"].float()
        values, log_pi = self._evaluate(batch["obs"], action)
        cut = batch["cut"].cpu().numpy().astype(bool)
        terminated = batch["terminated"].cpu().numpy().astype(bool)
        v = values.cpu().numpy()
        next_values = np.where(cut, self._bootstrap(batch, cut, terminated),
                               np.append(v[1:], np.float32(0.0)))
        log_rhos = (log_pi - batch["log_prob"].float()).cpu().numpy()
        out = vtrace(log_rhos, v, next_values,
                     batch["reward"].cpu().numpy() * c.reward_scale,
                     c.gamma * (1.0 - terminated), cut, c.rho_bar, c.c_bar, c.gae_lambda)
        rhos = np.exp(log_rhos)
        metrics: dict[str, torch.Tensor | float] = {
            "importance_weight_mean": float(out.clipped_rhos.mean()),
            "importance_weight_truncated": float((rhos > c.rho_bar).mean())}
        return (torch.from_numpy(out.advantages).to(self.device),
                torch.from_numpy(out.vs).to(self.device), metrics)

    def _policy_loss(self, advantages: torch.Tensor, ratio: torch.Tensor,
                     log_prob: torch.Tensor) -> torch.Tensor:
        if self.cfg.impala:  # the advantages already carry min(rho_bar, pi/mu)
            return -(advantages * log_prob).sum()
        return super()._policy_loss(advantages, ratio, log_prob)
