"""Stopped from outside, nothing is left running: a bench given SIGTERM (a runner's timeout)
takes its `rlfleet up` and that cluster down with it, and `rlfleet up` given SIGHUP (a closed
terminal) stops its children in order, as it does on Ctrl-C."""

from __future__ import annotations

import signal
import subprocess
import sys
import uuid

from .helpers import REPO, marked_env, marked_pids, proc_cmdline, small_config, wait_for


def _roles_running(marker: str) -> set[str]:
    roles = set()
    for pid in marked_pids(marker):
        cmdline = proc_cmdline(pid)
        for role in ("coordinator", "learner", "collector"):
            if f"rlfleet {role}" in cmdline or f"rlfleet.cli {role}" in cmdline:
                roles.add(role)
    return roles


def test_a_bench_stopped_with_sigterm_takes_its_cluster_down(tmp_path):
    marker = uuid.uuid4().hex
    bench = subprocess.Popen(
        [sys.executable, "-m", "bench.time_to_solve", "--seeds", "0", "--collectors", "1",
         "--work-dir", str(tmp_path / "work")], cwd=REPO, env=marked_env(marker),
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: {"coordinator", "learner", "collector"} <= _roles_running(marker),
                 90, "the bench's cluster to be up")
        bench.send_signal(signal.SIGTERM)
        bench.wait(timeout=60)
        wait_for(lambda: not marked_pids(marker), 30, "every process of the bench to exit")
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()


def test_up_stops_its_children_in_order_on_sighup(launch, tmp_path):
    config = small_config(tmp_path / "hup.yaml", stop={"max_env_steps": 5_000_000,
                                                       "max_wall_s": 200})
    run_dir = tmp_path / "run"
    up = launch("--config", str(config), "--collectors", "1", "--run-dir", str(run_dir),
                "--quiet")
    wait_for(lambda: {"coordinator", "learner", "collector"} <= _roles_running(up.marker), 90,
             "the cluster to be up")
    wait_for(lambda: (run_dir / "logs" / "collector-1.log").exists()
             and "registered as" in (run_dir / "logs" / "collector-1.log").read_text(), 60,
             "collector-1 to register")
    up.proc.send_signal(signal.SIGHUP)
    code = up.wait(timeout=60)
    assert code == 130, up.stderr[-3000:]
    assert (run_dir / "summary.json").exists()  # it stopped in order: the summary is written
    up.assert_no_orphans()
