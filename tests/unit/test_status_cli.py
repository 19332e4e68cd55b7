"""`rlfleet status` against a live coordinator: the cluster as tables, and a clear failure
when no coordinator answers."""

from __future__ import annotations

import subprocess
import sys

from .helpers import collector_and_learner, free_port, report, write_chunk


def run_status(url: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlfleet", "status", "--coordinator", url],
                          capture_output=True, text=True, timeout=60,
                          env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})


def test_status_prints_the_run_workers_tasks_and_buffers(coordinator, task_sink):
    c = coordinator()
    col, collect, lrn, _ = collector_and_learner(c, task_sink)
    chunk = write_chunk(c, 100)
    report(c, col["worker_id"], collect["task_id"], [(chunk, 100)])
    out = run_status(c.url)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for expected in ("running", "env steps", "workers", col["worker_id"], lrn["worker_id"],
                     "active tasks", collect["task_id"], "buffers", "replay", "uniform"):
        assert expected in text, expected
    assert "100" in text  # the env steps just reported


def test_status_without_a_coordinator_fails_clearly():
    out = run_status(f"http://127.0.0.1:{free_port()}")
    assert out.returncode == 1
    assert "cannot read status" in out.stdout + out.stderr
