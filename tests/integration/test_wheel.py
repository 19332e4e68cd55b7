"""The wheel: built from a clean copy of the repository (what `git clone` gives: tracked
files and nothing else, so no stale `build/` can leak into it), it installs exactly one
top-level import name, `rlfleet`, into an empty virtual environment; from there, outside the
repository, `rlfleet --version` answers and `python -m rlfleet up --config cartpole-dqn`
solves CartPole with the config shipped inside the package."""

from __future__ import annotations

import json
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from .helpers import REPO, marked_env


def _clean_copy(dest: Path) -> Path:
    """The repository's files as a clone of it would hold them: tracked, plus new files not
    ignored (so an uncommitted module is built too); never `build/`, `.venv/` or caches."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], cwd=REPO, capture_output=True,
                            check=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    src = _clean_copy(tmp_path_factory.mktemp("clone"))
    assert not (src / "build").exists()
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                           "--no-build-isolation", "--disable-pip-version-check", "-q",
                           "-w", str(out), str(src)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (found,) = out.glob("rlfleet-*.whl")
    return found


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """An empty venv with the wheel installed, and this environment's dependencies (torch,
    gymnasium, ...) visible behind it: a `.pth` line adds their directory to the path
    without running its `.pth` files, so this checkout's editable install stays out."""
    root = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True, timeout=120)
    python = root / "bin" / "python"
    done = subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "-q",
                           "--disable-pip-version-check", str(wheel)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    purelib = subprocess.run([str(python), "-c", "import sysconfig; "
                              "print(sysconfig.get_paths()['purelib'])"], capture_output=True,
                             text=True, check=True).stdout.strip()
    deps = [p for p in site.getsitepackages() if Path(p).is_dir()]
    (Path(purelib) / "rlfleet-test-deps.pth").write_text("\n".join(deps) + "\n")
    return root


def test_the_wheel_holds_one_top_level_name(wheel):
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        top_level = next(n for n in names if n.endswith(".dist-info/top_level.txt"))
        assert zf.read(top_level).decode().split() == ["rlfleet"]
    tops = {n.split("/")[0] for n in names if ".dist-info/" not in n}
    assert tops == {"rlfleet"}
    for needed in ("rlfleet/__main__.py", "rlfleet/py.typed", "rlfleet/configs/cartpole-dqn.yaml",
                   "rlfleet/shared/algos/registry.py",
                   "rlfleet/coordinator/dashboard/static/index.html"):
        assert needed in names, needed
    assert not [n for n in names if "/tests/" in n or n.startswith(("tests/", "bench/"))]


def test_the_installed_package_says_its_version_from_anywhere(venv, tmp_path):
    python = venv / "bin" / "python"
    where = subprocess.run([str(python), "-c", "import rlfleet; print(rlfleet.__file__)"],
                           capture_output=True, text=True, cwd=tmp_path, check=True)
    assert where.stdout.strip().startswith(str(venv)), where.stdout  # the wheel's, not ours
    for cmd in ([str(python), "-m", "rlfleet", "--version"],
                [str(venv / "bin" / "rlfleet"), "--version"]):
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=60)
        assert done.returncode == 0 and done.stdout.strip() == "rlfleet 0.1.0", done.stderr


def test_the_installed_package_solves_cartpole_outside_the_repository(venv, tmp_path):
    env = marked_env("wheel-test")
    env.pop("PYTHONPATH", None)
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "rlfleet", "up", "--config", "cartpole-dqn",
         "--collectors", "2", "--run-dir", str(tmp_path / "run"), "--quiet"],
        cwd=tmp_path, capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["solved"] is True and summary["eval_return"] >= 475
    assert REPO not in tmp_path.parents  # it ran outside the repository
