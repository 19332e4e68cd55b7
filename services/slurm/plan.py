"""What `rlfleet slurm submit` decided, kept in `<run-dir>/slurm/plan.json`: the jobs' names,
their resources and the commands they run. Every job of the run reads it, so a requeued job
runs as the first one did, and the keeper submits new jobs exactly like the first."""

from __future__ import annotations

import json
import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rlfleet.shared.contract.config import ConfigError

SLURM_DIR = "slurm"  # in the run directory: the plan, the scripts, the rendezvous, the logs
PLAN_FILE = "plan.json"
ROLES = ("coordinator", "learner", "collector")
# Slurm's time formats: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS, or UNLIMITED.
TIME = re.compile(r"^(\d+|\d+:\d{2}|\d+:\d{2}:\d{2}|\d+-\d+(:\d{2}(:\d{2})?)?|UNLIMITED)$")


class SlurmPlan(BaseModel):
    """The run's jobs. Field names are the `rlfleet slurm submit` options they come from."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tag: str = Field(pattern=r"^[A-Za-z0-9._-]{1,80}$", description="the stem of every job "
                     "name of the run: `<tag>-coordinator`, `<tag>-learner`, `<tag>-collector`")
    run_dir: str
    config: str = Field(description="the resolved config in the run directory")
    storage: str = Field(description="the run's storage (a shared path or redis://); with "
                         "--redis, the coordinator job's Redis, decided when it starts")
    collectors: int = Field(ge=0, le=10_000)
    learners: int = Field(ge=1, le=1_024)
    python: list[str] = Field(min_length=1, description="the command that runs Python with "
                              "rlfleet installed, on every node")
    partition: str | None = None
    learner_partition: str | None = None
    collector_partition: str | None = None
    learner_gpus: int = Field(0, ge=0, le=64)
    learner_cpus: int = Field(2, ge=1, le=4096)
    collector_cpus: int = Field(1, ge=1, le=4096)
    coordinator_cpus: int = Field(1, ge=1, le=4096)
    mem: str | None = Field(None, pattern=r"^\d+[KMGT]?$")
    time: str | None = Field(None, description="the worker jobs' time limit")
    coordinator_time: str | None = None
    signal_s: int | None = Field(None, ge=1, le=65_535, description="seconds of warning "
                                 "(SIGUSR1) before a job's time limit: it stops cleanly and "
                                 "requeues itself")
    account: str | None = None
    sbatch_args: list[str] = Field(default_factory=list)
    redis: bool = False
    submitted_at: float = 0.0

    def name(self, role: str) -> str:
        return f"{self.tag}-{role}"

    def slurm_dir(self) -> Path:
        return Path(self.run_dir) / SLURM_DIR

    def partition_for(self, role: str) -> str | None:
        own = {"learner": self.learner_partition,
               "collector": self.collector_partition}.get(role)
        return own or self.partition


def check_time(value: str | None, option: str) -> str | None:
    if value is not None and not TIME.match(value):
        raise ConfigError(f"{option}={value!r}: give a Slurm time limit (minutes, HH:MM:SS, "
                          "D-HH:MM:SS or UNLIMITED)")
    return value


def write_plan(plan: SlurmPlan) -> Path:
    path = plan.slurm_dir() / PLAN_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(plan.model_dump_json(indent=2))
    return path


def load_plan(run_dir: str | Path) -> SlurmPlan:
    """The plan of a run `rlfleet slurm submit` made; `ConfigError` naming the file if none."""
    path = Path(run_dir) / SLURM_DIR / PLAN_FILE
    try:
        return SlurmPlan.model_validate(json.loads(path.read_text()))
    except OSError as err:
        raise ConfigError(f"{path}: no Slurm plan here ({err.strerror}): is {run_dir} a run "
                          "directory `rlfleet slurm submit` made?") from None
    except (ValueError, ValidationError) as err:
        raise ConfigError(f"{path}: not a Slurm plan: {err}") from None
