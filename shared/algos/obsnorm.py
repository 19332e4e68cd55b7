"""Observation normalisation shared by every collector: one running mean and variance.

With several collectors, each normalising by what it alone has seen, the same state would
reach the policy as different inputs depending on who stepped it. Here the statistics have one
owner, the learner: each collector counts the raw observations of a chunk (`RunningMoments`,
sent in the chunk's metadata), the learner merges those counts (Chan et al.'s parallel
algorithm, exact whatever the split) and publishes the result inside the policy's weights
(`ObsNormalizer`'s buffers), and every collector and evaluator normalises with the statistics
of the version it acts with, frozen until the next one. Chunks store the normalised
observations the policy acted on, so learning sees exactly what acting saw.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from rlfleet.shared.util.moments import RunningMoments


class ObsNormalizer(nn.Module):
    """The published statistics: buffers, so they travel in the policy's state dict and
    checkpoints, never in the optimiser. Normalised observations are clipped to `clip`
    standard deviations, as gymnasium's NormalizeObservation users do (CleanRL: 10)."""

    # buffers (register_buffer): saved in the state dict, moved by `to`
    count: torch.Tensor
    mean: torch.Tensor
    var: torch.Tensor

    def __init__(self, shape: tuple[int, ...], clip: float = 10.0, eps: float = 1e-8) -> None:
        super().__init__()
        self.clip = clip
        self.eps = eps
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self._refresh()

    def _refresh(self) -> None:
        """numpy copies for the collector's hot path, taken when the statistics change."""
        self._mean = self.mean.cpu().numpy().astype(np.float32)
        self._inv_std = (1.0 / np.sqrt(self.var.cpu().numpy() + self.eps)).astype(np.float32)

    def _load_from_state_dict(self, *args, **kwargs) -> None:
        super()._load_from_state_dict(*args, **kwargs)
        self._refresh()

    def moments(self) -> RunningMoments:
        count = float(self.count)
        return RunningMoments(count, self.mean.cpu().numpy().copy(), self.var.cpu().numpy() * count)

    def merge(self, delta: RunningMoments) -> None:
        """Fold a collector's moments into the statistics (the learner's side)."""
        total = self.moments()
        total.merge(delta)
        self.count.fill_(total.count)
        self.mean.copy_(torch.from_numpy(total.mean))
        self.var.copy_(torch.from_numpy(total.var))
        self._refresh()

    def normalize(self, obs: np.ndarray) -> np.ndarray:
        if float(self.count) == 0:
            return np.asarray(obs, dtype=np.float32)
        out = (np.asarray(obs, dtype=np.float32) - self._mean) * self._inv_std
        return np.clip(out, -self.clip, self.clip, out=out)

    def normalize_tensor(self, obs: torch.Tensor) -> torch.Tensor:
        """`normalize` for a batch already in torch, on this module's device, with no host
        round trip (an off-policy learner normalises every batch it learns from so)."""
        x = obs.float()
        normed = ((x - self.mean.float()) * torch.rsqrt(self.var.float() + self.eps)).clamp(
            -self.clip, self.clip)
        return torch.where(self.count > 0, normed, x)
