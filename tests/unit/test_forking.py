"""Roles started in a forked copy of a launcher (`services/local/forking.py`), against real
children: a coordinator that serves on a loopback port, a status command that reads its
environment, a role that fails on its arguments. The forks run from a fresh interpreter (a
driver script), as they do from `rlfleet up`: pytest's own process holds torch and threads,
which is exactly what must never be forked."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

DRIVER = r'''
import atexit, json, os, signal, subprocess, sys, threading, time, urllib.request
from pathlib import Path

from rlfleet.cli import free_port, main as cli_main
from rlfleet.local.forking import can_fork, fork_role, preload

atexit.register(lambda: print("launcher atexit ran in", os.getpid(), flush=True))
tmp = Path(sys.argv[1])
out = {"launcher": os.getpid(), "can_fork": can_fork()}
env = {**os.environ, "PYTHONUNBUFFERED": "1"}


def setup():
    os.setpgid(0, 0)


# A role that fails on its arguments: exit code 2 and its one line in the log.
out["bad"] = fork_role(["coordinator"], tmp / "bad.log", env, setup).wait(60)

# A real coordinator, forked with its modules preloaded.
preload("coordinator")
port = free_port()
coord = fork_role(["coordinator", "--config", sys.argv[2], "--run-dir", str(tmp / "run"),
                   "--port", str(port)], tmp / "coordinator.log", env, setup)
url = f"http://127.0.0.1:{port}"


def answers(child, url):
    """Wait, with a deadline, until the child serves `url`/health."""
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(url + "/health", timeout=1).read()
            return
        except OSError:
            assert child.poll() is None and time.monotonic() < deadline, "never answered"
            time.sleep(0.05)


answers(coord, url)
out["cmdline"] = open(f"/proc/{coord.pid}/cmdline").read().replace("\0", " ").strip()
out["pgid"] = os.getpgid(coord.pid) == coord.pid
try:
    coord.wait(0.05)
    out["timeout"] = False
except subprocess.TimeoutExpired:
    out["timeout"] = True

# The environment given is the child's: `rlfleet status` (a command of the whole CLI, not a
# role's) finds the coordinator through it.
status = fork_role(["status"], tmp / "status.log", {**env, "RLFLEET_COORDINATOR": url}, setup,
                   cli_main)
out["status"] = status.wait(60)

coord.terminate()
out["coordinator"] = coord.wait(60)
port = free_port()
killed = fork_role(["coordinator", "--config", sys.argv[2], "--run-dir", str(tmp / "run2"),
                    "--port", str(port)], tmp / "killed.log", env, setup)
answers(killed, f"http://127.0.0.1:{port}")
killed.kill()
out["killed"] = killed.wait(60)
release = threading.Event()
other = threading.Thread(target=release.wait)
other.start()
out["can_fork_with_thread"] = can_fork()
release.set()
other.join()
print(json.dumps(out), flush=True)
'''


def test_forked_roles_behave_as_exec_ones(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", DRIVER, str(tmp_path),
                           str(REPO / "configs" / "cartpole-dqn.yaml")],
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    out = json.loads(lines[-2])
    assert out["can_fork"] and not out["can_fork_with_thread"]
    # Only the launcher runs its own exit work; a child never returns into its code.
    assert lines[-1] == f"launcher atexit ran in {out['launcher']}"
    assert sum("atexit" in line for line in lines) == 1 and len(lines) == 2, lines

    assert out["bad"] == 2
    assert "rlfleet coordinator: coordinator needs --config" in (tmp_path / "bad.log").read_text()

    assert out["cmdline"].startswith("rlfleet coordinator --config")   # its title
    assert out["pgid"] and out["timeout"]
    assert out["status"] == 0
    assert "cartpole-dqn" in (tmp_path / "status.log").read_text()
    assert out["coordinator"] == 0                       # SIGTERM: a clean stop
    assert (tmp_path / "run" / "storage").is_dir()
    assert "rlfleet.coordinator" in (tmp_path / "coordinator.log").read_text()
    assert out["killed"] == -9


def test_only_linux_forks(monkeypatch) -> None:
    """On macOS (and any system but Linux) a fork after numpy or a system framework loaded is
    unsound: the launcher execs its children there instead."""
    from rlfleet.local import forking

    monkeypatch.setattr(forking.sys, "platform", "darwin")
    assert not forking.can_fork()


TORCH_DRIVER = r'''
import json, os, sys
from pathlib import Path

from rlfleet.local import forking

tmp = Path(sys.argv[1])
out = {"before": "torch" in sys.modules}
forking.preload("coordinator")
out["coordinator_brings_torch"] = "torch" in sys.modules
forking.preload("collector")
out["collector_brings_torch"] = "torch" in sys.modules
out["can_fork"] = forking.can_fork()


def ops(argv):
    """What a forked learner does first: torch operations on several intra-op threads."""
    import torch

    torch.set_num_threads(2)
    x = torch.randn(256, 256)
    print(float((x @ x).sum()) == float((x @ x).sum()), torch.get_num_threads(), flush=True)
    return 0


child = forking.fork_role(["learner"], tmp / "child.log", dict(os.environ), lambda: None, ops)
out["child"] = child.wait(120)
out["child_said"] = (tmp / "child.log").read_text().strip()
print(json.dumps(out), flush=True)
'''


def test_learners_and_collectors_share_the_launchers_one_torch_import(tmp_path: Path) -> None:
    """torch is imported once, before the first learner or collector is forked (the
    coordinator never needs it), and a forked child runs torch operations on threads of its
    own: the launcher only imported it."""
    done = subprocess.run([sys.executable, "-c", TORCH_DRIVER, str(tmp_path)],
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.splitlines()[-1])
    assert out == {"before": False, "coordinator_brings_torch": False,
                   "collector_brings_torch": True, "can_fork": True, "child": 0,
                   "child_said": "True 2"}


def test_torch_imported_other_than_by_the_preload_is_never_forked() -> None:
    """torch imported by anything else (a user's env module, say) may have run operations,
    whose thread pools a fork would lose: the launcher execs its children then."""
    code = ("import torch\n"
            "from rlfleet.local import forking\n"
            "forking.preload('learner')\n"
            "print(forking.can_fork())\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
