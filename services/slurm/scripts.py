"""The batch scripts of a run's jobs, one per role, written to `<run-dir>/slurm/<role>.sbatch`.

Each is an ordinary sbatch script: `#SBATCH` lines for the role's resources, then one `exec`
of `rlfleet slurm job <role>`, so the role is the batch step's process and Slurm's signals
(`scancel`'s SIGTERM, the `--signal` warning) reach it, not a shell in between. Every job is
requeueable: a node that fails or a preemption puts it back in the queue under the same id,
and it continues the run where it left off. A person may submit one by hand
(`sbatch <run-dir>/slurm/collector.sbatch` adds a collector) or change it first.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from rlfleet.shared.infra.storage.credentials import PASSWORD_FILE_ENV
from rlfleet.slurm.plan import SlurmPlan

REDIS_PASSWORD_FILE = "redis.password"  # in <run-dir>/slurm/, mode 0600, with --redis


def sbatch_lines(plan: SlurmPlan, role: str) -> list[str]:
    """The role's `#SBATCH` options."""
    logs = plan.slurm_dir() / "logs"
    cpus = {"coordinator": plan.coordinator_cpus, "learner": plan.learner_cpus,
            "collector": plan.collector_cpus}[role]
    opts = [f"--job-name={plan.name(role)}", f"--output={logs}/{role}-%j.out",
            "--open-mode=append", "--nodes=1", "--ntasks=1", f"--cpus-per-task={cpus}",
            "--requeue"]
    partition = plan.partition_for(role)
    if partition:
        opts.append(f"--partition={partition}")
    if role == "learner" and plan.learner_gpus:
        opts.append(f"--gres=gpu:{plan.learner_gpus}")
    limit = plan.coordinator_time if role == "coordinator" else plan.time
    if limit:
        opts.append(f"--time={limit}")
    if plan.signal_s:
        opts.append(f"--signal=B:USR1@{plan.signal_s}")
    if plan.mem:
        opts.append(f"--mem={plan.mem}")
    if plan.account:
        opts.append(f"--account={plan.account}")
    opts += plan.sbatch_args
    return [f"#SBATCH {o}" for o in opts]


def render(plan: SlurmPlan, role: str) -> str:
    command = [*plan.python, "-m", "rlfleet", "slurm", "job", role, "--run-dir", plan.run_dir]
    head = (["# `rlfleet slurm submit` submitted it; its keeper starts, replaces and cancels",
             "# the learner and collector jobs as `rlfleet scale` asks."]
            if role == "coordinator" else
            [f"# The coordinator's keeper submits it; `sbatch` it by hand for one more {role}."])
    lines = ["#!/bin/bash",
             f"# rlfleet: the {role} of run {Path(plan.run_dir).name}, written by `rlfleet "
             "slurm submit`.", *head, *sbatch_lines(plan, role), ""]
    if plan.redis:
        lines.append(f"export {PASSWORD_FILE_ENV}="
                     f"{shlex.quote(str(plan.slurm_dir() / REDIS_PASSWORD_FILE))}")
    lines.append(f"exec {shlex.join(command)}")
    return "\n".join(lines) + "\n"


def write_scripts(plan: SlurmPlan) -> dict[str, Path]:
    """Every role's script, written; by role."""
    out = {}
    (plan.slurm_dir() / "logs").mkdir(parents=True, exist_ok=True)
    for role in ("coordinator", "learner", "collector"):
        path = plan.slurm_dir() / f"{role}.sbatch"
        path.write_text(render(plan, role))
        path.chmod(0o755)
        out[role] = path
    return out


def script(plan: SlurmPlan, role: str) -> Path:
    return plan.slurm_dir() / f"{role}.sbatch"
