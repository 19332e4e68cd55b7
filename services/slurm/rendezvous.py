"""Where the coordinator is: `<run-dir>/slurm/coordinator.json`, written by the coordinator's
job once it answers, read by every other job of the run and by `rlfleet status/scale
--run-dir`. The run directory is on a path every node mounts, so a job needs nothing but the
run directory to find the coordinator, wherever Slurm put either of them; a coordinator
requeued onto another node writes its new address, and the jobs started after read it."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from rlfleet.slurm.plan import SLURM_DIR

RENDEZVOUS_FILE = "coordinator.json"


class Rendezvous(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    url: str
    job_id: str
    node: str
    restart_count: int = 0
    storage: str
    started_at: float  # time.time() when the coordinator answered
    ended: bool = False  # the run is over: nothing should wait for this coordinator


def path(run_dir: str | Path) -> Path:
    return Path(run_dir) / SLURM_DIR / RENDEZVOUS_FILE


def write(run_dir: str | Path, rv: Rendezvous) -> None:
    """Atomically: a reader sees the old address or the new one, never half of one."""
    target = path(run_dir)
    tmp = target.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(rv.model_dump_json(indent=2))
    os.replace(tmp, target)


def read(run_dir: str | Path) -> Rendezvous | None:
    try:
        return Rendezvous.model_validate(json.loads(path(run_dir).read_text()))
    except (OSError, ValueError):
        return None


def wait(run_dir: str | Path, timeout_s: float,
         give_up: Callable[[], str | None] = lambda: None) -> Rendezvous:
    """The coordinator's address, once written; polls the file. `give_up` says why waiting
    is pointless (the coordinator's job is gone), checked now and then. `TimeoutError` after
    `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    checked = 0.0
    while True:
        rv = read(run_dir)
        if rv is not None and not rv.ended:
            return rv
        now = time.monotonic()
        if now >= deadline:
            raise TimeoutError(f"no coordinator address in {path(run_dir)} after {timeout_s:g} s")
        if now - checked >= 15:
            checked = now
            why = give_up()
            if why:
                raise TimeoutError(why)
        time.sleep(1.0)
