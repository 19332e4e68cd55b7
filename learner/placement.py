"""Where this learner trains and in what arithmetic: `learner.device` and `learner.precision`
applied to its policy, and what `/status` says of the device.

A built-in policy is `Placeable` and `MixedPrecision` (`shared/algos/capabilities.py`); a
policy that is not trains on the CPU in fp32: `auto` then means the CPU (said once in the
log), while an explicit `cuda` or a mixed precision is refused with an error naming the field,
as a setting that cannot be honoured must be.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from rlfleet.shared.algos.base import Policy
from rlfleet.shared.algos.capabilities import MixedPrecision
from rlfleet.shared.algos.device import Precision, place_policy
from rlfleet.shared.contract.config import ConfigError, LearnerConfig

log = logging.getLogger("rlfleet.learner")


@dataclass(eq=False)
class Placement:
    """The device and precision a learner's policy was placed with."""

    device: torch.device
    precision: Precision

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def status(self) -> dict[str, Any]:
        """`/status`'s `device`: the device, its name and memory in use (a GPU's)."""
        out: dict[str, Any] = {"device": str(self.device), **self.precision.status()}
        if self.cuda:
            out.update(
                name=torch.cuda.get_device_name(self.device),
                memory_allocated_bytes=int(torch.cuda.memory_allocated(self.device)),
                memory_reserved_bytes=int(torch.cuda.memory_reserved(self.device)),
                max_memory_allocated_bytes=int(torch.cuda.max_memory_allocated(self.device)),
                memory_total_bytes=int(torch.cuda.get_device_properties(
                    self.device).total_memory))
        return out


def place(policy: Policy, cfg: LearnerConfig, count: int | None = None) -> Placement:
    """Move `policy` to `learner.device` and give it `learner.precision`; `ConfigError`
    (naming the field) where the machine or the policy cannot. `count`: CUDA devices seen
    (tests), this machine's when None."""
    name = type(policy).__name__
    device = place_policy(policy, cfg.device, "learner.device", count)
    precision = Precision(cfg.precision, device)
    if precision.mixed:
        if not isinstance(policy, MixedPrecision):
            raise ConfigError(f"learner.precision={cfg.precision!r}: policy {name} has no "
                              "set_precision (MixedPrecision), so it learns in fp32 only; "
                              "use learner.precision=fp32")
        policy.set_precision(precision)
    if device.type == "cuda":
        log.info("learning on %s (%s), %s", device, torch.cuda.get_device_name(device),
                 precision.name)
    elif precision.mixed:
        log.info("learning on the CPU in %s (autocast)", precision.name)
    return Placement(device, precision)
