"""Where a policy's tensors live and in what arithmetic it learns: device and precision.

`learner.device` and `collector.device` name a device as a person would (`auto`, `cpu`,
`cuda`, `cuda:N`); `resolve_device` turns that into a `torch.device` on this machine, and
`cuda_refusal` says why a setting cannot be met here, naming the field, for the launch check
and the worker that would otherwise fail later with torch's own message. `cuda` in a learner
group means the rank's local GPU: rank i of N on one machine trains on `cuda:i`, from
`LOCAL_RANK` (torchrun, `rlfleet up`) or `SLURM_LOCALID`; `CUDA_VISIBLE_DEVICES` is applied by
CUDA itself, so the indices count the visible devices only.

`Precision` is `learner.precision`: autocast to bf16 or fp16 around the forward and backward
passes, and for fp16 torch's gradient scaler between backward and the optimizer step (fp16's
range underflows small gradients without it). Parameters, optimizer state, checkpoints and
published weights stay fp32 under either: autocast changes what kernels compute in, never
what tensors hold, so a checkpoint of a bf16 learner loads into an fp32 one on any device.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from rlfleet.shared.algos.base import Optimizer
from rlfleet.shared.contract.config import cuda_devices_needed

log = logging.getLogger("rlfleet.device")

_CUDA = re.compile(r"^cuda(?::(\d+))?$")
LOCAL_RANK_VARS = ("LOCAL_RANK", "SLURM_LOCALID")


def cuda_count() -> int:
    """CUDA devices this process sees (0 on a CPU build, or where the driver is missing)."""
    try:
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except (RuntimeError, AssertionError):  # a CUDA build on a machine without a driver
        return 0


def local_rank(environ: Mapping[str, str] | None = None) -> int | None:
    """This process's place among the learners of its machine, where a launcher said."""
    env = os.environ if environ is None else environ
    for name in LOCAL_RANK_VARS:
        value = env.get(name, "").strip()
        if value.isdigit():
            return int(value)
    return None


def cuda_refusal(setting: str, field: str, count: int | None = None) -> str | None:
    """Why `setting` cannot be met on a machine with `count` CUDA devices (this one's when
    None), naming `field`; None when it can (auto and cpu always can)."""
    need = cuda_devices_needed(setting)
    if need == 0:
        return None
    n = cuda_count() if count is None else count
    if n == 0:
        return (f"{field}={setting!r}, but this machine has no CUDA device (torch "
                f"{torch.__version__}, CUDA available: {torch.cuda.is_available()}); use "
                f"{field}=auto or cpu, or run this role on a GPU machine")
    if n < need:
        return (f"{field}={setting!r}, but this machine has {n} CUDA device"
                f"{'s' if n != 1 else ''} (cuda:0..cuda:{n - 1})")
    return None


def resolve_device(setting: str, rank: int | None = None, count: int | None = None
                   ) -> torch.device:
    """The device a setting names here. `auto` is CUDA when there is one; `cuda` without
    an index is the local rank's GPU (`rank`, else `LOCAL_RANK`/`SLURM_LOCALID`, modulo the
    devices seen, so more ranks than GPUs share them), else GPU 0. Raises `ValueError` with
    `cuda_refusal`'s message where CUDA is asked for and missing."""
    n = cuda_count() if count is None else count
    if setting == "cpu" or (setting == "auto" and n == 0):
        return torch.device("cpu")
    why = cuda_refusal(setting if setting != "auto" else "cuda", "device", n)
    if why:
        raise ValueError(why)
    m = _CUDA.match(setting)
    if m is not None and m.group(1) is not None:
        return torch.device("cuda", int(m.group(1)))
    r = local_rank() if rank is None else rank
    return torch.device("cuda", (r or 0) % n)


def place_policy(policy: object, setting: str, field: str, count: int | None = None
                 ) -> torch.device:
    """Move a `Placeable` policy to the device `setting` names and return that device. A
    policy that is not Placeable stays on the CPU: under `auto` quietly (said in the log),
    under an explicit CUDA setting it is refused. `ConfigError`s name `field`."""
    from rlfleet.shared.algos.capabilities import Placeable
    from rlfleet.shared.contract.config import ConfigError

    try:
        device = resolve_device(setting, count=count)
    except ValueError as err:
        raise ConfigError(str(err).replace("device=", f"{field}=", 1)) from err
    name = type(policy).__name__
    if device.type != "cpu" and not isinstance(policy, Placeable):
        if setting != "auto":
            raise ConfigError(f"{field}={setting!r}: policy {name} is not Placeable (it has "
                              f"no to(device)), so it runs on the CPU only; use {field}=cpu")
        log.info("%s=auto: policy %s is not Placeable, so it stays on the CPU", field, name)
        return torch.device("cpu")
    if isinstance(policy, Placeable):
        policy.to(device)
    return device


def to_device(data: Mapping[str, torch.Tensor], device: torch.device,
              non_blocking: bool = False) -> dict[str, torch.Tensor]:
    """Every tensor of a batch on `device` (no copy where it already is)."""
    return {k: v.to(device, non_blocking=non_blocking) for k, v in data.items()}


def host_state(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A state dict on the CPU, for safetensors (a no-op for a CPU learner's)."""
    return {k: v.detach().cpu() for k, v in state.items()}


class Precision:
    """`learner.precision` for one policy on one device: `autocast()` around the forward
    passes (and the backward, which autocast sends to the same kernels), `backward` and
    `step` for the optimizer, with fp16's gradient scaler in between."""

    DTYPES: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16,
                                             "fp16": torch.float16}

    def __init__(self, name: str = "fp32", device: torch.device | str = "cpu") -> None:
        if name not in self.DTYPES:
            raise ValueError(f"learner.precision={name!r}: expected one of "
                             f"{', '.join(self.DTYPES)}")
        self.name = name
        self.device = torch.device(device)
        self.dtype = self.DTYPES[name]
        self.scaler: torch.amp.GradScaler | None = (
            torch.amp.GradScaler(self.device.type) if name == "fp16" else None)

    @property
    def mixed(self) -> bool:
        return self.dtype is not None

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        if self.dtype is None:
            yield
            return
        with torch.autocast(self.device.type, dtype=self.dtype):
            yield

    def backward(self, loss: torch.Tensor) -> None:
        """Gradients of `loss` (scaled for fp16: `unscale` before reading them)."""
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def unscale(self, optimizer: Optimizer) -> None:
        """The gradients back at their true scale, before clipping (fp16; else nothing).
        In a learner group, call it after the gradients are summed, so every rank sees the
        same sums and skips or takes the same step."""
        if self.scaler is not None:
            # torch's types ask for a torch.optim.Optimizer; the scaler reads only what every
            # `Optimizer` here has (param_groups, step), FusedAdam included
            self.scaler.unscale_(optimizer)  # type: ignore[arg-type]

    def step(self, optimizer: Optimizer) -> None:
        """The optimizer's step; fp16 skips a step whose gradients overflowed and adapts
        its scale."""
        if self.scaler is None:
            optimizer.step()
            return
        self.scaler.step(optimizer)  # type: ignore[arg-type]  # as in `unscale`
        self.scaler.update()

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {"precision": self.name}
        if self.scaler is not None:
            out["grad_scale"] = float(self.scaler.get_scale())
        return out


FP32 = Precision()
