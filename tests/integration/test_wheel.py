"""The wheel: built from a clean copy of the repository (what `git clone` gives: tracked
files and nothing else, so no stale `build/` can leak into it), it installs exactly one
top-level import name, `rlfleet`, into an empty virtual environment; from there, outside the
repository, `rlfleet --version` answers and `python -m rlfleet up --config cartpole-dqn`
solves CartPole with the config shipped inside the package.

That environment holds a torch before the wheel comes: the one this suite runs (in CI the
on-disk CPU build of the constraints pin), installed first, and then the wheel with its
dependencies and no constraints file. pip must keep that torch: the wheel declares a range,
not a pin, so installing rlfleet never replaces a user's torch (tests/integration/test_py313.py
does the same on Python 3.13 with the top of the range, from nothing)."""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import site
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

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


def build_wheel(tmp: Path) -> Path:
    """rlfleet's wheel, built from a clean copy of the repository under `tmp`."""
    src = _clean_copy(tmp / "clone")
    assert not (src / "build").exists()
    out = tmp / "dist"
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                           "--no-build-isolation", "--disable-pip-version-check", "-q",
                           "-w", str(out), str(src)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (found,) = out.glob("rlfleet-*.whl")
    return found


def pip(python: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    """`python -m pip install ARGS` in a venv, quietly; fails the test with pip's stderr."""
    done = subprocess.run([str(python), "-m", "pip", "install", "-q",
                           "--disable-pip-version-check", *args], capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def installed_torch(python: Path) -> dict[str, str]:
    """The version and the location of the torch `python` imports, and the modification
    time of its metadata's RECORD (a reinstall rewrites it)."""
    code = ("import importlib.metadata as m, json, torch; d = m.distribution('torch'); "
            "(r,) = [f for f in d.files if f.name == 'RECORD' and '.dist-info' in str(f)]; "
            "print(json.dumps({'version': torch.__version__, 'file': torch.__file__, "
            "'record': str(r.locate().stat().st_mtime_ns)}))")
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True,
                          timeout=300, check=True)
    return json.loads(done.stdout)


def install_wheel_keeping_torch(python: Path, wheel: Path, report: Path) -> dict[str, str]:
    """Install `wheel` with its dependencies and no constraints file into `python`'s venv,
    which already holds a torch; assert pip neither replaced nor reinstalled it. Returns
    that torch."""
    before = installed_torch(python)
    assert before["file"].startswith(str(python.parents[1])), before  # the venv's own
    pip(python, "--report", str(report), str(wheel))
    installed = {item["metadata"]["name"].lower(): item["metadata"]["version"]
                 for item in json.loads(report.read_text())["install"]}
    assert "rlfleet" in installed, installed
    assert "torch" not in installed, f"pip installed torch {installed['torch']} over " \
                                     f"{before['version']}"
    after = installed_torch(python)
    assert after == before, (before, after)
    return after


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """An empty venv holding this suite's torch (installed from pip's usual sources: in CI
    the on-disk CPU build), then the wheel. The other dependencies (gymnasium, flask, ...)
    are this environment's, visible behind it: a `.pth` line adds their directory to the path
    without running its `.pth` files, so this checkout's editable install stays out, and pip
    finds them installed rather than fetching them."""
    root = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True, timeout=120)
    python = root / "bin" / "python"
    # Before the `.pth`: pip would otherwise find this environment's torch and install none.
    # Its distribution's version, which names the file (`torch.__version__` of PyPI's build
    # carries a `+cu130` that its wheel's name does not).
    ours = importlib.metadata.version("torch")
    pip(python, "--no-deps", f"torch=={ours}")
    purelib = subprocess.run([str(python), "-c", "import sysconfig; "
                              "print(sysconfig.get_paths()['purelib'])"], capture_output=True,
                             text=True, check=True).stdout.strip()
    deps = [p for p in site.getsitepackages() if Path(p).is_dir()]
    (Path(purelib) / "rlfleet-test-deps.pth").write_text("\n".join(deps) + "\n")
    kept = install_wheel_keeping_torch(python, wheel, root.parent / "report.json")
    assert kept["version"].split("+")[0] == ours.split("+")[0]
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


def test_the_wheel_declares_pyprojects_torch_range_and_pythons(wheel):
    """What pip reads is the wheel's metadata: the torch range and `Requires-Python` there
    are pyproject's (tests/unit/test_torch_range.py checks what that range admits)."""
    with zipfile.ZipFile(wheel) as zf:
        meta = zf.read(next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA")))
    headers = meta.decode().split("\n\n", 1)[0].splitlines()
    requires = [Requirement(h.split(":", 1)[1]) for h in headers if h.startswith("Requires-Dist:")]
    (torch_req,) = [r for r in requires if r.name == "torch"]
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    (declared,) = [Requirement(d) for d in project["dependencies"]
                   if Requirement(d).name == "torch"]
    assert torch_req.specifier == declared.specifier and torch_req.marker is None
    assert f"Requires-Python: {project['requires-python']}" in headers


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
