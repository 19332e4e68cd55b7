"""Network pieces and an optimiser helper shared by the built-in algorithms."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from shared.algos.adam import FusedAdam


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
    on small CPU networks the library version's bookkeeping cost a third of each update."""
    grads = [p.grad for p in params if p.grad is not None]
    norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    torch._foreach_mul_(grads, torch.clamp(max_norm / (norm + 1e-6), max=1.0))
    return norm


def gradients(params: list[torch.nn.Parameter]) -> list[torch.Tensor]:
    """Every parameter's gradient, zeros where backward left none: a collective over them
    needs the same tensors on every rank, whatever a rank's shard touched."""
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    return [p.grad for p in params]


def sum_gradients(params: list[torch.nn.Parameter], reducer, extra: list[torch.Tensor] = (),
                  scale: float = 1.0) -> None:
    """Sum gradients (and `extra` tensors, in the same collective) over a learner group, then
    multiply the gradients by `scale` (1 / world size turns a sum of per-rank means into the
    mean over the whole batch)."""
    grads = gradients(params)
    reducer.sum_(grads + list(extra))
    if scale != 1.0:
        torch._foreach_mul_(grads, scale)


def optimizer_state(optimizer: torch.optim.Optimizer | FusedAdam, prefix: str = "optim."
                    ) -> dict[str, torch.Tensor]:
    """An optimiser's per-parameter tensors and step counts as a flat tensor dict, so a
    checkpoint is plain safetensors (no pickle)."""
    out: dict[str, torch.Tensor] = {}
    for idx, st in optimizer.state_dict()["state"].items():
        for key, value in st.items():
            out[f"{prefix}{idx}.{key}"] = torch.as_tensor(value).detach().clone()
    return out


def load_optimizer_state(optimizer: torch.optim.Optimizer | FusedAdam,
                         state: dict[str, torch.Tensor], prefix: str = "optim.") -> None:
    current = optimizer.state_dict()
    per_param: dict[int, dict[str, torch.Tensor]] = {}
    for name, value in state.items():
        if not name.startswith(prefix):
            continue
        idx, key = name[len(prefix):].split(".", 1)
        per_param.setdefault(int(idx), {})[key] = value.clone()
    current["state"] = per_param
    optimizer.load_state_dict(current)
