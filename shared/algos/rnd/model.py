"""Random Network Distillation (Burda et al. 2018): an exploration bonus for sparse rewards.

A target network with fixed random weights maps each (normalised) next observation to an
embedding; a predictor network is trained to reproduce it on the states the agent has seen.
Where the predictor is still wrong, the state is new: its squared error is the intrinsic
reward. It falls on states visited often and stays high on the rest, so an agent trained on

    reward = extrinsic + scale * intrinsic / running std(intrinsic)

goes where it has not been, long before it ever sees an extrinsic reward there.

- Observations are normalised by a running mean and variance of every next observation
  trained on, and clipped to `obs_clip` (the paper's 5): a fixed random network of raw
  MountainCar states (velocities of 0.07 beside positions of 1) would see one dimension only.
- The intrinsic reward is divided by a running std of the intrinsic rewards trained on
  (`shared/util/moments.py`), so `scale` means the same whatever the networks' sizes. The early,
  large errors stay in that std, so the bonus fades as the predictor learns the world.
- The predictor takes one Adam step per `train` call on the whole batch.

In a learner group each rank trains on its shard; the ranks sum the statistics of their
shards and their gradients of (sum of errors / rows of the whole batch), so every rank takes
the step one learner would take on the whole batch, and all keep identical state.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from torch import nn

from rlfleet.shared.algos.base import Reducer
from rlfleet.shared.algos.nets import (
    NatureCNN,
    gradients,
    load_optimizer_state,
    mlp,
    optimizer_state,
)
from rlfleet.shared.algos.optim import adam
from rlfleet.shared.algos.rnd.config import RNDConfig
from rlfleet.shared.contract.spec import EnvSpec, is_image
from rlfleet.shared.util.moments import RunningMoments


def _embedder(spec: EnvSpec, hidden: tuple[int, ...], out: int) -> nn.Module:
    if is_image(spec.obs_shape):
        trunk = NatureCNN(spec.obs_shape)
        return nn.Sequential(trunk, nn.Linear(trunk.features, out))
    return nn.Sequential(nn.Flatten(), mlp(int(np.prod(spec.obs_shape)), hidden, out))


class RND:
    """`algo.reward_model: {path: rnd, kwargs: {scale: ..., ...}}`; the kwargs are
    `RNDConfig`'s."""

    def __init__(self, spec: EnvSpec, seed: int = 0, *, scale: float = 1.0,
                 hidden_sizes: tuple[int, ...] | list[int] = (64, 64), embedding_size: int = 64,
                 lr: float = 1e-3, obs_clip: float = 5.0, extrinsic: float = 1.0) -> None:
        RNDConfig(scale=scale, hidden_sizes=tuple(hidden_sizes), embedding_size=embedding_size,
                  lr=lr, obs_clip=obs_clip, extrinsic=extrinsic)  # raises naming the field
        self.spec = spec
        self.scale = float(scale)
        self.extrinsic = float(extrinsic)
        self.obs_clip = float(obs_clip)
        hidden = tuple(int(h) for h in hidden_sizes)
        gen = torch.random.fork_rng()  # the caller's global generator stays as it was
        with gen:
            torch.manual_seed(seed + 7919)
            self.target = _embedder(spec, hidden, embedding_size)
            self.predictor = _embedder(spec, hidden, embedding_size)
        self.target.requires_grad_(False)
        self._params = list(self.predictor.parameters())
        self.optimizer = adam(self._params, lr=lr)
        self.obs_moments = RunningMoments.empty(spec.obs_shape)
        self.int_moments = RunningMoments.empty(())
        self.reducer: Reducer | None = None
        self._norm_cache: tuple[float, torch.Tensor, torch.Tensor] | None = None

    def set_reducer(self, reducer: Reducer | None) -> None:
        self.reducer = reducer

    # -- the bonus ------------------------------------------------------------------------------

    def _normalised(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs.to(torch.float32)
        if self.obs_moments.count == 0:
            return x
        count = self.obs_moments.count
        if self._norm_cache is None or self._norm_cache[0] != count:
            mean = torch.from_numpy(self.obs_moments.mean.astype(np.float32))
            inv_std = torch.from_numpy((1.0 / np.sqrt(self.obs_moments.var + 1e-8))
                                       .astype(np.float32))
            self._norm_cache = (count, mean, inv_std)
        _, mean, inv_std = self._norm_cache
        return ((x - mean) * inv_std).clamp_(-self.obs_clip, self.obs_clip)

    def errors(self, obs: torch.Tensor) -> torch.Tensor:
        """The predictor's squared error per row: the raw intrinsic reward (with gradient
        towards the predictor)."""
        x = self._normalised(obs)
        with torch.no_grad():
            target = self.target(x)
        return (self.predictor(x) - target).pow(2).mean(dim=1)

    def intrinsic(self, obs: torch.Tensor) -> torch.Tensor:
        """The normalised intrinsic reward of each observation (no gradient)."""
        with torch.no_grad():
            err = self.errors(obs)
        std = float(np.sqrt(self.int_moments.var)) if self.int_moments.count else 1.0
        return err / max(std, 1e-8)

    def estimate(self, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        reward = batch["reward"].to(torch.float32)
        return self.extrinsic * reward + self.scale * self.intrinsic(batch["next_obs"])

    # -- learning -----------------------------------------------------------------------------

    def _moments_of(self, x: np.ndarray, ref: np.ndarray) -> list[torch.Tensor]:
        """count, sum and sum of squares of `x - ref` (float64), to sum over ranks: with
        `ref` the running mean they hold no large cancelling terms."""
        d = x.astype(np.float64) - ref
        return [torch.tensor([float(len(x))], dtype=torch.float64),
                torch.from_numpy(d.sum(axis=0)), torch.from_numpy((d * d).sum(axis=0))]

    @staticmethod
    def _merge(moments: RunningMoments, stats: list[torch.Tensor], ref: np.ndarray) -> None:
        n = float(stats[0].item())
        if n <= 0:
            return
        s1, s2 = stats[1].numpy(), stats[2].numpy()
        mean_d = s1 / n
        m2 = np.maximum(s2 - n * mean_d * mean_d, 0.0)
        moments.merge(RunningMoments(n, ref + mean_d, m2))

    def train(self, batch: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor | float]:
        group = self.reducer if self.reducer is not None and self.reducer.world_size > 1 \
            else None
        next_obs = batch.get("next_obs")
        if next_obs is None:  # a rank's empty share of a rollout: it still joins the sums
            next_obs = torch.zeros((0, *self.spec.obs_shape))
        # 1. observation statistics, over the whole (group's) batch
        ref = self.obs_moments.mean.copy()
        obs_stats = self._moments_of(next_obs.to(torch.float32).numpy()
                                     .reshape(len(next_obs), *self.spec.obs_shape), ref)
        if group is not None:
            group.sum_(obs_stats)
        self._merge(self.obs_moments, obs_stats, ref)
        total_rows = float(obs_stats[0].item())
        # 2. the predictor's step on the mean error over the whole batch
        err = self.errors(next_obs)
        loss = err.sum() / max(total_rows, 1.0)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        err = err.detach()
        int_ref = self.int_moments.mean.copy()
        int_stats = self._moments_of(err.numpy()[:, None], int_ref.reshape(1))
        int_stats = [int_stats[0], int_stats[1].reshape(()), int_stats[2].reshape(())]
        loss_sum = loss.detach().reshape(1).clone()
        if group is not None:  # gradients and the error statistics in one collective
            group.sum_(gradients(self._params) + int_stats + [loss_sum])
        self.optimizer.step()
        # 3. the intrinsic rewards' running std, from the errors before the step
        self._merge(self.int_moments, int_stats, int_ref)
        std = float(np.sqrt(self.int_moments.var))
        mean = err.mean() if len(err) else torch.zeros(())
        return {"predictor_loss": loss_sum[0], "intrinsic_mean": mean,
                "intrinsic_max": err.max() if len(err) else 0.0, "intrinsic_std": std,
                "intrinsic_norm_mean": mean / max(std, 1e-8)}

    # -- checkpoints --------------------------------------------------------------------------

    def state_dict(self) -> dict[str, torch.Tensor]:
        out = {f"target.{k}": v.detach().clone() for k, v in self.target.state_dict().items()}
        out.update({f"predictor.{k}": v.detach().clone()
                    for k, v in self.predictor.state_dict().items()})
        out.update(optimizer_state(self.optimizer))
        for name, m in (("obs", self.obs_moments), ("int", self.int_moments)):
            out[f"{name}_moments.count"] = torch.tensor(m.count, dtype=torch.float64)
            out[f"{name}_moments.mean"] = torch.from_numpy(np.array(m.mean, dtype=np.float64))
            out[f"{name}_moments.m2"] = torch.from_numpy(np.array(m.m2, dtype=np.float64))
        return out

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        self.target.load_state_dict({k[7:]: v for k, v in state.items()
                                     if k.startswith("target.")})
        self.predictor.load_state_dict({k[10:]: v for k, v in state.items()
                                        if k.startswith("predictor.")})
        load_optimizer_state(self.optimizer, dict(state))
        for name in ("obs", "int"):
            m = RunningMoments(float(state[f"{name}_moments.count"]),
                               state[f"{name}_moments.mean"].numpy().copy(),
                               state[f"{name}_moments.m2"].numpy().copy())
            setattr(self, f"{name}_moments", m)
        self._norm_cache = None
