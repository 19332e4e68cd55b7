"""Membership (worker -> coordinator): registering, with what the worker has, and
heartbeats.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from rlfleet.shared.contract.wire.base import Count, Finite, Id, Request, Response, Role


class GpuInfo(Request):
    """One GPU a worker can use, as torch numbers it (after `CUDA_VISIBLE_DEVICES`)."""

    index: int = Field(ge=0, le=1023, description="the device's number: `cuda:<index>`")
    name: str = Field(min_length=1, max_length=256, description="e.g. 'NVIDIA H100 80GB HBM3'")
    memory_bytes: Count = Field(description="the device's total memory")


class SlurmPlacement(Request):
    """Where Slurm runs a worker: its job and node, from the job's environment
    (`SLURM_JOB_ID`, `SLURMD_NODENAME`, `SLURM_RESTART_COUNT`)."""

    job_id: str = Field(min_length=1, max_length=64, pattern=r"^[0-9]+([_+][0-9]+)?$",
                        description="the Slurm job id (an array or het job's `N_M`, `N+M`)")
    node: str = Field(min_length=1, max_length=253, description="the node Slurm chose")
    restart_count: int = Field(0, ge=0, le=1_000_000, description="times the job was "
                               "requeued before this run of it")


class WorkerResources(Request):
    """What a worker has, as it reports it when it registers (`shared/infra/resources.py`)."""

    hostname: str = Field(min_length=1, max_length=253, description="the machine's name")
    cpu_cores: int = Field(ge=1, le=1_000_000, description="the cores this process may run "
                           "on (its CPU affinity), not all the machine's")
    memory_bytes: Count = Field(description="the machine's total memory")
    gpus: list[GpuInfo] = Field(default_factory=list, max_length=1024,
                                description="the GPUs this process can use; empty: none")
    slurm: SlurmPlacement | None = Field(None, description="the Slurm job and node the "
                                         "worker runs in; null: not under Slurm")


class RegisterRequest(Request):
    role: Role
    url: str = Field(min_length=1, max_length=512, pattern=r"^https?://",
                     description="where the coordinator reaches this worker's HTTP service")
    worker_id: Id | None = Field(None, description="a stable id; registering again under it "
                                 "from the same URL (a restart) replaces the old entry; from "
                                 "another URL while the holder still heartbeats and answers "
                                 "there, 409")
    resources: WorkerResources | None = Field(None, description="what the worker has; a "
                                              "config asking for CUDA (`learner.device`, "
                                              "`collector.device`) refuses a worker that "
                                              "reports no such GPU (409). Absent: not checked")


class RegisterResponse(Response):
    worker_id: str
    run_name: str
    storage: str
    config: dict[str, Any]
    heartbeat_interval_s: float
    # The run's env steps so far: a collector (re)started mid-run explores from there, not
    # from the schedule's start (nor at random as at the run's start).
    env_steps: int = Field(default=0, ge=0)


class HeartbeatRequest(Request):
    status: dict[str, Finite] = Field(default_factory=dict, max_length=64)
    url: str | None = Field(None, min_length=1, max_length=512, pattern=r"^https?://",
                            description="the URL this worker registered with: a 409 says "
                            "another process holds its id now. Absent: not checked")


class HeartbeatResponse(Response):
    stop: bool
    paused: bool = False
    policy_version: int | None
    env_steps: int
    group_generation: int | None = Field(None, description="learners: the learner group's "
                                         "current generation; a learner in an older one "
                                         "re-forms")
