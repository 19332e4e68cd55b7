"""What a worker has: its host, the CPU cores it may use, memory and GPUs, and where Slurm
placed it (`WorkerResources`), probed once and sent with every registration.

- CPU cores are the ones this process may run on (`os.sched_getaffinity`: a container's or
  Slurm's CPU set), not the machine's count.
- Memory is the machine's total (`/proc/meminfo`; psutil or `os.sysconf` elsewhere).
- GPUs are what torch sees, so `CUDA_VISIBLE_DEVICES` is already applied: index 0 is the
  first visible device. This layer does not import torch: the caller hands over a function
  that returns `torch.cuda` (`shared/worker.py`), called only where a GPU driver is present
  (`GPU_DRIVER_PATHS`), so a process on a machine without one never imports torch for
  this. Anything raised while asking CUDA is logged and reported as no GPUs: probing must
  not stop a worker.

`RLFLEET_FAKE_GPUS` (a test and operations hook) replaces the GPU probe: a comma-separated
list of `name:memory_bytes`, e.g. `NVIDIA H100 80GB HBM3:85899345920,NVIDIA H100 80GB
HBM3:85899345920`; empty or `0` means none. With it a CPU machine can show the coordinator's
refusal of a config that asks for CUDA, or its acceptance.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from rlfleet.shared.contract.config import ConfigError
from rlfleet.shared.contract.wire.membership import GpuInfo, SlurmPlacement, WorkerResources

log = logging.getLogger("rlfleet.resources")

FAKE_GPUS_ENV = "RLFLEET_FAKE_GPUS"
# Any of these: a GPU driver is loaded (NVIDIA, on the host or passed into a container; AMD's
# ROCm, which torch also drives as `cuda`; WSL's GPU bridge). None: no GPU to ask torch for.
GPU_DRIVER_PATHS = ("/proc/driver/nvidia/gpus", "/dev/nvidiactl", "/dev/kfd", "/dev/dxg")
MEMINFO = Path("/proc/meminfo")


class CudaApi(Protocol):
    """The part of `torch.cuda` the probe asks."""

    def is_available(self) -> bool: ...

    def device_count(self) -> int: ...

    def get_device_properties(self, device: int) -> Any: ...


def parse_fake_gpus(value: str) -> list[GpuInfo]:
    """`RLFLEET_FAKE_GPUS`'s value as GPUs; a `ConfigError` naming the variable when it is
    not `name:memory_bytes,...`, empty or `0`."""
    value = value.strip()
    if value in ("", "0"):
        return []
    gpus = []
    for index, item in enumerate(value.split(",")):
        name, _, memory = item.strip().rpartition(":")
        try:
            gpus.append(GpuInfo(index=index, name=name.strip(), memory_bytes=int(memory)))
        except ValueError:  # int() or the model's bounds (pydantic's error is a ValueError)
            raise ConfigError(f"{FAKE_GPUS_ENV}={value!r}: give name:memory_bytes for each "
                              f"GPU, comma-separated (got {item.strip()!r}), or 0 for none"
                              ) from None
    return gpus


def cuda_gpus(cuda: CudaApi) -> list[GpuInfo]:
    """The GPUs `cuda` (torch.cuda) can use; none, with a warning, where asking raises."""
    try:
        if not cuda.is_available():
            return []
        gpus = []
        for index in range(cuda.device_count()):
            props = cuda.get_device_properties(index)
            gpus.append(GpuInfo(index=index, name=str(props.name)[:256] or "unknown",
                                memory_bytes=int(props.total_memory)))
        return gpus
    except Exception as err:  # a broken driver or CUDA install: report none, keep working
        log.warning("could not probe CUDA devices, reporting none: %s: %s",
                    type(err).__name__, err)
        return []


def smi_gpus() -> list[GpuInfo] | None:
    """The GPUs `nvidia-smi` lists, filtered by a `CUDA_VISIBLE_DEVICES` of indices; None
    where it cannot say (no nvidia-smi, device UUIDs in the variable). Asked before torch
    because `torch.cuda.get_device_properties` opens a CUDA context (hundreds of MB of GPU
    memory) in every process that probes, collectors included."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    wanted: list[int] | None = None
    if visible is not None:
        items = [v.strip() for v in visible.split(",") if v.strip()]
        if not all(v.isdigit() for v in items):
            return None
        wanted = [int(v) for v in items]
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total",
                               "--format=csv,noheader,nounits"], capture_output=True,
                              text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    listed = []
    for line in done.stdout.splitlines():
        name, _, mib = line.rpartition(",")
        if name.strip() and mib.strip().isdigit():
            listed.append((name.strip()[:256], int(mib.strip()) * 1024 * 1024))
    order = range(len(listed)) if wanted is None else [i for i in wanted if i < len(listed)]
    return [GpuInfo(index=k, name=listed[i][0], memory_bytes=listed[i][1])
            for k, i in enumerate(order)]


def gpu_driver_present() -> bool:
    return any(os.path.exists(p) for p in GPU_DRIVER_PATHS)


def cpu_cores() -> int:
    """The cores this process may run on."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def memory_bytes() -> int:
    """The machine's total memory in bytes; 0 where it cannot be read."""
    try:
        for line in MEMINFO.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024  # in kB
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil  # a dev dependency only; what answers on a machine without /proc
    except ImportError:
        pass
    else:
        return int(psutil.virtual_memory().total)
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return 0


def probe_resources(cuda: Callable[[], CudaApi | None] | None = None) -> WorkerResources:
    """This process's resources. `cuda` returns `torch.cuda`, or None without torch; it is
    called only where a GPU driver is present and `RLFLEET_FAKE_GPUS` is unset. A bad
    `RLFLEET_FAKE_GPUS` raises `ConfigError`."""
    fake = os.environ.get(FAKE_GPUS_ENV)
    if fake is not None:
        gpus = parse_fake_gpus(fake)
    elif gpu_driver_present() and (listed := smi_gpus()) is not None:
        gpus = listed
    elif cuda is not None and gpu_driver_present():
        try:
            api = cuda()
        except Exception as err:  # torch fails to import: it will say so where it is used
            log.warning("could not load CUDA to probe GPUs, reporting none: %s: %s",
                        type(err).__name__, err)
            api = None
        gpus = cuda_gpus(api) if api is not None else []
    else:
        gpus = []
    return WorkerResources(hostname=(socket.gethostname() or "unknown")[:253],
                           cpu_cores=cpu_cores(), memory_bytes=memory_bytes(), gpus=gpus,
                           slurm=slurm_placement())


def slurm_placement(environ: Mapping[str, str] | None = None) -> SlurmPlacement | None:
    """The Slurm job and node this process runs in, from the variables Slurm sets in every
    job; None outside Slurm, or where they do not parse (logged: a worker still registers)."""
    environ = os.environ if environ is None else environ
    job = environ.get("SLURM_JOB_ID")
    if not job:
        return None
    node = environ.get("SLURMD_NODENAME") or (socket.gethostname() or "unknown")
    try:
        return SlurmPlacement(job_id=job, node=node[:253],
                              restart_count=int(environ.get("SLURM_RESTART_COUNT") or 0))
    except ValueError as err:  # pydantic's ValidationError is one
        log.warning("SLURM_JOB_ID=%r: not reported: %s", job, err)
        return None


def describe_gpus(gpus: list[dict[str, Any]] | list[GpuInfo]) -> str:
    """GPUs in a few words: `1x NVIDIA H100 80GB HBM3 (80 GiB)`, grouped by kind; `none`
    for none. Takes the models or their JSON."""
    counts: dict[tuple[str, int], int] = {}
    for gpu in gpus:
        g = gpu.model_dump() if isinstance(gpu, GpuInfo) else gpu
        key = (g["name"], round(g["memory_bytes"] / 2**30))
        counts[key] = counts.get(key, 0) + 1
    if not counts:
        return "none"
    return ", ".join(f"{n}x {name} ({gib} GiB)" for (name, gib), n in counts.items())
