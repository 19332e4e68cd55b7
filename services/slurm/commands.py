"""The Slurm commands rlfleet calls (`sbatch`, `squeue`, `scancel`, `scontrol`), each with a
time limit and its error turned into a `SlurmError` that says which command failed and what
Slurm said. Nothing here parses more of Slurm's output than the fields it asks for."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

COMMAND_TIMEOUT_S = 30.0
# squeue's states in which a job holds, or will hold, a place in the run: counted as present.
LIVE_STATES = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED",
                         "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SUSPENDED", "STOPPED",
                         "SIGNALING", "STAGE_OUT", "RESV_DEL_HOLD"})
FIELDS = "%i|%j|%T|%N|%r"  # job id, name, state, nodes, reason


class SlurmError(RuntimeError):
    """A Slurm command failed or is not installed."""


@dataclass(frozen=True)
class Job:
    """One job as `squeue` lists it."""

    job_id: str
    name: str
    state: str
    nodes: str
    reason: str

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES


def available() -> str | None:
    """Why Slurm's commands cannot be used here, or None."""
    missing = [c for c in ("sbatch", "squeue", "scancel", "scontrol") if not shutil.which(c)]
    return f"Slurm's {', '.join(missing)} not on PATH" if missing else None


def run(argv: Sequence[str], env: Mapping[str, str] | None = None,
        timeout_s: float = COMMAND_TIMEOUT_S) -> str:
    """A Slurm command's stdout; `SlurmError` naming the command when it fails. `env` is
    the command's whole environment (None: this process's)."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s,
                              env=None if env is None else dict(env))
    except FileNotFoundError:
        raise SlurmError(f"`{argv[0]}` is not installed (Slurm's client commands must be on "
                         "PATH)") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"`{' '.join(argv)}` did not answer within {timeout_s:g} s") from None
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip()
        raise SlurmError(f"`{' '.join(argv)}` exited {done.returncode}: {said}")
    return done.stdout


def sbatch(script: str, options: Sequence[str] = (),
           env: Mapping[str, str] | None = None) -> str:
    """Submit a batch script; its job id."""
    out = run(["sbatch", "--parsable", *options, script], env=env).strip()
    job_id = out.split(";", 1)[0]  # `id;cluster` on a multi-cluster setup
    if not job_id:
        raise SlurmError(f"sbatch {script}: no job id in its answer {out!r}")
    return job_id


def jobs(names: Sequence[str]) -> list[Job]:
    """The jobs with these names (every user's: the run's jobs may be requeued by root)."""
    if not names:
        return []
    out = run(["squeue", "--noheader", "--all", "--name", ",".join(names), "--format",
               FIELDS])
    listed = []
    for line in out.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 5:
            listed.append(Job(*parts))
    return listed


def cancel(job_ids: Sequence[str], signal: str | None = None) -> None:
    """`scancel`: SIGTERM to every process of the jobs, then SIGKILL after Slurm's
    `KillWait` (the grace in which a collector drains and a learner checkpoints)."""
    if job_ids:
        run(["scancel", *(["--signal", signal] if signal else []), *job_ids])


def requeue(job_id: str) -> None:
    """Put a job back in the queue: it ends now and runs again, under the same id."""
    run(["scontrol", "requeue", job_id])


def node_address(node: str) -> str | None:
    """The node's address as Slurm knows it (`NodeAddr`), or None."""
    try:
        out = run(["scontrol", "show", "node", node, "--oneliner"])
    except SlurmError:
        return None
    for item in out.split():
        if item.startswith("NodeAddr="):
            return item.split("=", 1)[1] or None
    return None
