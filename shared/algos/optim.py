"""The optimizer boundary: the one place the built-in algorithms touch torch's private kernels,
each behind a public fallback.

- `adam(params, lr)` gives torch's fused Adam kernel (`torch._fused_adam_`) without the
  `torch.optim` machinery (`FusedAdam`, `shared/algos/adam.py`) where this torch has it,
  and `torch.optim.Adam` where it does not. A `FusedAdam` whose kernel refuses a call (a
  device or dtype it does not support) hands its state to a `torch.optim.Adam` and goes on
  with it: the two keep the same state layout, so nothing is lost and checkpoints load in
  either.
- `foreach_norms` and `foreach_mul_` are `torch._foreach_norm` and `torch._foreach_mul_`,
  or the same arithmetic one tensor at a time.

torch has a CPU kernel for `_fused_adam_` from 2.4, where pyproject's torch range starts; the
`_foreach_*` calls are older. Each fallback is tested by taking the kernel away: removed
before rlfleet is imported, or refusing every step (tests/unit/test_optim.py).

What an algorithm may hold is an `Optimizer` (`shared/algos/base.py`): `torch.optim.Adam`,
`FusedAdam`, or any object with the same members.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch

from rlfleet.shared.algos.base import Optimizer

log = logging.getLogger("rlfleet.optim")


def fused_adam_available() -> bool:
    """Whether this torch has the private kernels `FusedAdam` calls."""
    return all(hasattr(torch, name) for name in ("_fused_adam_", "_foreach_add_",
                                                 "_foreach_sub_"))


def adam(params: Iterable[torch.nn.Parameter], lr: float,
         betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> Optimizer:
    """Adam over `params`: the fused kernel without `torch.optim` where this torch has it
    (every learner saves the memory and the per-step wrappers `torch.optim` costs), else
    `torch.optim.Adam`."""
    if fused_adam_available():
        from rlfleet.shared.algos.adam import FusedAdam

        return FusedAdam(params, lr=lr, betas=betas, eps=eps)
    log.info("torch %s has no torch._fused_adam_: using torch.optim.Adam", torch.__version__)
    return torch.optim.Adam(list(params), lr=lr, betas=betas, eps=eps)


def foreach_norms(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """The L2 norm of each tensor."""
    fn = getattr(torch, "_foreach_norm", None)
    if fn is not None:
        try:
            return list(fn(tensors))
        except (RuntimeError, TypeError, NotImplementedError):
            pass
    return [torch.linalg.vector_norm(t) for t in tensors]


def foreach_mul_(tensors: list[torch.Tensor], scalar: torch.Tensor | float) -> None:
    """Multiply each tensor by `scalar`, in place."""
    fn = getattr(torch, "_foreach_mul_", None)
    if fn is not None:
        try:
            fn(tensors, scalar)
            return
        except (RuntimeError, TypeError, NotImplementedError):
            pass
    for t in tensors:
        t.mul_(scalar)
