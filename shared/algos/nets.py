"""Network pieces and an optimiser helper shared by the built-in algorithms."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import nn

from rlfleet.shared.algos.base import Optimizer
from rlfleet.shared.algos.optim import foreach_mul_, foreach_norms


def mlp(in_dim: int, hidden: Sequence[int], out_dim: int, activation: type[nn.Module] = nn.ReLU
        ) -> nn.Sequential:
    layers: list[nn.Module] = []
    for h in hidden:
        layers += [nn.Linear(in_dim, h), activation()]
        in_dim = h
    layers.append(nn.Linear(in_dim, out_dim))
    return nn.Sequential(*layers)


def clip_grad_norm(params: list[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
    """Scale gradients so their global L2 norm is at most `max_norm`; returns the norm before
    scaling. The same result as `torch.nn.utils.clip_grad_norm_`, in two foreach kernels:
    on small CPU networks the library version's bookkeeping is a large share of an update."""
    grads = [p.grad for p in params if p.grad is not None]
    norm = torch.linalg.vector_norm(torch.stack(foreach_norms(grads)))
    foreach_mul_(grads, torch.clamp(max_norm / (norm + 1e-6), max=1.0))
    return norm


def gradients(params: list[torch.nn.Parameter]) -> list[torch.Tensor]:
    """Every parameter's gradient, zeros where backward left none: a collective over them
    needs the same tensors on every rank, whatever a rank's shard touched."""
    grads = []
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        grads.append(p.grad)
    return grads


def sum_gradients(params: list[torch.nn.Parameter], reducer, extra: Sequence[torch.Tensor] = (),
                  scale: float = 1.0) -> None:
    """Sum gradients (and `extra` tensors, in the same collective) over a learner group, then
    multiply the gradients by `scale` (1 / world size turns a sum of per-rank means into the
    mean over the whole batch)."""
    grads = gradients(params)
    reducer.sum_(grads + list(extra))
    if scale != 1.0:
        foreach_mul_(grads, scale)


def optimizer_state(optimizer: Optimizer, prefix: str = "optim.") -> dict[str, torch.Tensor]:
    """An optimiser's per-parameter tensors and step counts as a flat tensor dict, so a
    checkpoint is plain safetensors (no pickle)."""
    out: dict[str, torch.Tensor] = {}
    for idx, st in optimizer.state_dict()["state"].items():
        for key, value in st.items():
            out[f"{prefix}{idx}.{key}"] = torch.as_tensor(value).detach().clone()
    return out


def load_optimizer_state(optimizer: Optimizer, state: dict[str, torch.Tensor],
                         prefix: str = "optim.") -> None:
    current = optimizer.state_dict()
    per_param: dict[int, dict[str, torch.Tensor]] = {}
    for name, value in state.items():
        if not name.startswith(prefix):
            continue
        idx, key = name[len(prefix):].split(".", 1)
        per_param.setdefault(int(idx), {})[key] = value.clone()
    current["state"] = per_param
    optimizer.load_state_dict(current)


def as_obs_tensor(obs: np.ndarray | torch.Tensor, device: torch.device | None = None
                  ) -> torch.Tensor:
    """Observations for a network on `device` (None: where they are): uint8 images stay
    uint8 (the network scales them, so a batch of frames crosses memory, and the bus to a
    GPU, at a quarter of the float size), the rest float32."""
    t = torch.as_tensor(obs, device=device)
    return t if t.dtype == torch.uint8 else t.to(torch.float32)


class NatureCNN(nn.Module):
    """The convolutional trunk of Mnih et al. (2015), 'Human-level control through deep
    reinforcement learning': 32 8x8/4, 64 4x4/2, 64 3x3/1, then 512 units. It takes uint8
    frames and divides by 255 itself, on whatever device it lives on."""

    def __init__(self, obs_shape: Sequence[int], features: int = 512,
                 init: Callable[[nn.Conv2d | nn.Linear, float], None] | None = None) -> None:
        super().__init__()
        channels, height, width = obs_shape
        self.convs = nn.Sequential(
            nn.Conv2d(channels, 32, 8, stride=4), nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(), nn.Flatten())
        with torch.no_grad():
            flat = self.convs(torch.zeros(1, channels, height, width)).shape[1]
        self.fc = nn.Sequential(nn.Linear(flat, features), nn.ReLU())
        self.features = features
        if init is not None:
            for m in self.modules():
                if isinstance(m, nn.Conv2d | nn.Linear):
                    init(m, math.sqrt(2))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs.float() / 255.0 if obs.dtype == torch.uint8 else obs.float()
        return self.fc(self.convs(x))


def orthogonal_(layer: nn.Conv2d | nn.Linear, gain: float) -> None:
    """CleanRL's `layer_init`: orthogonal weights of `gain`, zero biases."""
    nn.init.orthogonal_(layer.weight, gain)
    if layer.bias is not None:
        nn.init.zeros_(layer.bias)
