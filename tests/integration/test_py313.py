"""rlfleet as a user on Python 3.13 gets it: the wheel, built from a clean copy, installed into
a fresh 3.13 virtual environment that already holds the newest torch of the range
(constraints/newest.txt, not the pin CI uses), with its dependencies and no constraints file.
pip keeps that torch; then `rlfleet single --config cartpole-dqn` trains CartPole to its stop
value there, outside the repository.

It downloads that torch and every dependency for 3.13 (several GB, a CUDA build from PyPI, or
pip's cache), so it runs only where `RLFLEET_PY313` names a Python 3.13 interpreter, as
`make test-py313` does (README, "Pythons and torch")."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from .helpers import REPO, marked_env
from .test_wheel import build_wheel, install_wheel_keeping_torch, pip

PY313 = os.environ.get("RLFLEET_PY313", "")

pytestmark = pytest.mark.skipif(
    not PY313, reason="installs torch for Python 3.13 from PyPI (several GB): "
                      "`make test-py313` runs it (RLFLEET_PY313=python3.13)")


def constraints_pin(name: str) -> str:
    """The torch version a constraints file pins (`torch==X`)."""
    for line in (REPO / "constraints" / name).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("torch=="):
            return line.removeprefix("torch==")
    raise AssertionError(f"constraints/{name} pins no torch")


def test_the_wheel_on_python_313_keeps_its_torch_and_solves_cartpole(tmp_path):
    python313 = shutil.which(PY313) or PY313
    version = subprocess.run([python313, "-c", "import sys; print(sys.version_info[:2])"],
                             capture_output=True, text=True, timeout=60)
    assert version.stdout.strip() == "(3, 13)", \
        f"RLFLEET_PY313={PY313} is not a Python 3.13: {version.stdout}{version.stderr}"
    newest, pinned = constraints_pin("newest.txt"), constraints_pin("pinned.txt")
    assert newest != pinned  # a torch the constraints pin would not have chosen

    wheel = build_wheel(tmp_path)
    root = tmp_path / "venv313"
    subprocess.run([python313, "-m", "venv", str(root)], check=True, timeout=300)
    python = root / "bin" / "python"
    pip(python, f"torch=={newest}", timeout=1800)  # with its CUDA libraries
    kept = install_wheel_keeping_torch(python, wheel, tmp_path / "report.json")
    assert kept["version"].split("+")[0] == newest

    work = tmp_path / "work"
    work.mkdir()
    env = marked_env("py313-wheel-test")
    env.pop("PYTHONPATH", None)
    done = subprocess.run([str(root / "bin" / "rlfleet"), "single", "--config", "cartpole-dqn"],
                          cwd=work, capture_output=True, text=True, timeout=1200, env=env)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    assert "'solved': True" in done.stdout, done.stdout[-2000:]
    assert REPO not in work.parents  # it ran outside the repository
