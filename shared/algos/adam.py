"""Adam for the built-in algorithms: the update of `torch.optim.Adam(fused=True)`, by the same
kernel (`torch._fused_adam_`), without the `torch.optim` machinery around it.

Why not `torch.optim.Adam` itself: building or stepping any `torch.optim` optimizer imports
`torch._dynamo` and sympy (its methods are wrapped to keep the compiler out), which cost every
learner about 70 MB of private memory and a CPU-second at its first update, and each step
goes through those wrappers (about 0.14 ms of a 0.5-2 ms update of a small network on this
project's machines). A learner on a small machine is the cluster's bottleneck.

`state_dict()` has `torch.optim.Adam`'s layout (per-parameter `step`, `exp_avg`,
`exp_avg_sq`; `param_groups` with `lr`, `betas`, `eps`), so checkpoints written with either
load into the other, and code that reads `param_groups[0]["lr"]` or sets it works unchanged.
One parameter group, no weight decay, no AMSGrad: what the built-in algorithms use. A user
policy may bring any `torch.optim` optimizer instead (`policy.optimizer = ...`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


class FusedAdam:
    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
        self.params = list(params)
        self.param_groups: list[dict[str, Any]] = [{
            "params": self.params, "lr": lr, "betas": betas, "eps": eps}]
        # Per parameter, made at its first step (as torch.optim does): step, exp_avg, exp_avg_sq.
        self.state: dict[int, dict[str, torch.Tensor]] = {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        group = self.param_groups[0]
        params, grads, avgs, sqs, steps = [], [], [], [], []
        for i, p in enumerate(self.params):
            if p.grad is None:
                continue
            st = self.state.get(i)
            if st is None:
                st = self.state[i] = {
                    "step": torch.zeros((), dtype=torch.float32, device=p.device),
                    "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                    "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}
            params.append(p)
            grads.append(p.grad)
            avgs.append(st["exp_avg"])
            sqs.append(st["exp_avg_sq"])
            steps.append(st["step"])
        if not params:
            return
        beta1, beta2 = group["betas"]
        torch._foreach_add_(steps, 1)
        torch._fused_adam_(params, grads, avgs, sqs, [], steps, lr=float(group["lr"]),
                           beta1=beta1, beta2=beta2, weight_decay=0.0, eps=group["eps"],
                           amsgrad=False, maximize=False)

    def state_dict(self) -> dict[str, Any]:
        group = {k: v for k, v in self.param_groups[0].items() if k != "params"}
        group["params"] = list(range(len(self.params)))
        return {"state": {i: dict(st) for i, st in self.state.items()},
                "param_groups": [group]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Loads what this class or `torch.optim.Adam` saved for the same parameters."""
        groups = state_dict.get("param_groups") or [{}]
        if len(groups) != 1:
            raise ValueError(f"expected one parameter group, got {len(groups)}")
        for key in ("lr", "betas", "eps"):
            if key in groups[0]:
                self.param_groups[0][key] = groups[0][key]
        state: dict[int, dict[str, torch.Tensor]] = {}
        for idx, st in state_dict["state"].items():
            i = int(idx)
            if not 0 <= i < len(self.params):
                raise ValueError(f"optimizer state for parameter {i}, but there are "
                                 f"{len(self.params)}")
            p = self.params[i]
            state[i] = {
                "step": torch.as_tensor(st["step"], dtype=torch.float32).to(p.device).clone(),
                "exp_avg": st["exp_avg"].to(p.device, p.dtype).clone(),
                "exp_avg_sq": st["exp_avg_sq"].to(p.device, p.dtype).clone()}
        self.state = state
