"""Adam for the built-in algorithms: the update of `torch.optim.Adam(fused=True)`, by the same
kernel (`torch._fused_adam_`), without the `torch.optim` machinery around it.

Why not `torch.optim.Adam` itself: building or stepping any `torch.optim` optimizer imports
`torch._dynamo` and sympy (its methods are wrapped to keep the compiler out), which costs
every learner tens of megabytes of private memory and a CPU-second or so at its first update,
and each step goes through those wrappers, a noticeable share of a small network's update
(bench/RESULTS.md). A learner on a small machine is the cluster's bottleneck.

`state_dict()` has `torch.optim.Adam`'s layout (per-parameter `step`, `exp_avg`,
`exp_avg_sq`; `param_groups` with `lr`, `betas`, `eps`), so checkpoints written with either
load into the other, and code that reads `param_groups[0]["lr"]` or sets it works unchanged.
One parameter group, no weight decay, no AMSGrad: what the built-in algorithms use. A user
policy may bring any `torch.optim` optimizer instead (`policy.optimizer = ...`).

Algorithms make it through `rlfleet.shared.algos.optim.adam`, which gives `torch.optim.Adam`
where this torch lacks the kernel. If the kernel refuses a step (a device or dtype it does
not support), this optimizer hands its state to a `torch.optim.Adam` over the same
parameters and steps with that from then on.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import torch

log = logging.getLogger("rlfleet.optim")


class FusedAdam:
    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
        self.params = list(params)
        self.param_groups: list[dict[str, Any]] = [{
            "params": self.params, "lr": lr, "betas": betas, "eps": eps}]
        # Per parameter, made at its first step (as torch.optim does): step, exp_avg, exp_avg_sq.
        self.state: dict[int, dict[str, torch.Tensor]] = {}
        # torch.optim.Adam, once the kernel refused a step: it owns the state from then on.
        self.fallback: torch.optim.Optimizer | None = None

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        if self.fallback is not None:
            self.fallback.param_groups[0]["lr"] = self.param_groups[0]["lr"]
            self.fallback.step()
            return
        group = self.param_groups[0]
        params: list[torch.Tensor] = []  # the kernel takes tensors (a Parameter is one)
        grads, avgs, sqs, steps = [], [], [], []
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
        try:
            torch._foreach_add_(steps, 1)
        except (AttributeError, RuntimeError, TypeError, NotImplementedError) as err:
            self._fall_back(err)
            return
        try:
            torch._fused_adam_(params, grads, avgs, sqs, [], steps, lr=float(group["lr"]),
                               beta1=beta1, beta2=beta2, weight_decay=0.0, eps=group["eps"],
                               amsgrad=False, maximize=False)
        except (AttributeError, RuntimeError, TypeError, NotImplementedError) as err:
            for s in steps:  # the step did not happen: its count goes back
                s.sub_(1)
            self._fall_back(err)

    def _fall_back(self, err: BaseException) -> None:
        """Go on with `torch.optim.Adam` from this optimizer's state, and take this step
        with it."""
        log.warning("torch's fused Adam kernel refused a step (%s: %s): going on with "
                    "torch.optim.Adam", type(err).__name__, err)
        group = self.param_groups[0]
        fallback = torch.optim.Adam(self.params, lr=float(group["lr"]), betas=group["betas"],
                                    eps=group["eps"])
        state = self.state_dict()
        self.fallback = fallback
        if self.state:
            self.load_state_dict(state)
        fallback.step()

    def state_dict(self) -> dict[str, Any]:
        if self.fallback is not None:
            return self.fallback.state_dict()
        group = {k: v for k, v in self.param_groups[0].items() if k != "params"}
        group["params"] = list(range(len(self.params)))
        return {"state": {i: dict(st) for i, st in self.state.items()},
                "param_groups": [group]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Loads what this class or `torch.optim.Adam` saved for the same parameters."""
        if self.fallback is not None:  # its own groups' settings, with what was saved
            theirs = self.fallback.state_dict()
            group = dict(theirs["param_groups"][0])
            group.update({k: v for k, v in (state_dict.get("param_groups") or [{}])[0].items()
                          if k in ("lr", "betas", "eps")})
            self.fallback.load_state_dict({"state": state_dict["state"],
                                           "param_groups": [group]})
            return
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
