"""One import package: every folder of the package is listed for the wheel, every module
imports under exactly one name, and the package's surface (`python -m rlfleet`, `--version`,
the packaged configs, `py.typed`) is there."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OLD_NAMES = ("shared", "services", "coordinator", "collector", "learner")


def _setuptools() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_package_folder_is_listed_for_the_wheel():
    st = _setuptools()
    listed = set(st["packages"])
    found = set()
    for pkg, folder in st["package-dir"].items():
        for init in (REPO / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(REPO / folder).parts
            found.add(".".join([pkg, *rel]))
    assert found == listed, (f"missing from pyproject's packages: {sorted(found - listed)}; "
                             f"listed but not a package: {sorted(listed - found)}")


def test_every_module_imports_under_one_name_only():
    """Importing every module of the package leaves none of the old top-level names in
    `sys.modules` and no file loaded twice."""
    code = """
import importlib, pkgutil, sys, rlfleet
files = {}
for info in pkgutil.walk_packages(rlfleet.__path__, "rlfleet."):
    importlib.import_module(info.name)
for name, mod in list(sys.modules.items()):
    f = getattr(mod, "__file__", None)
    if f and name.split(".")[0] in ("rlfleet",) + OLD:
        files.setdefault(f, []).append(name)
twice = {f: n for f, n in files.items() if len(n) > 1}
old = [n for n in sys.modules if n.split(".")[0] in OLD]
assert not twice and not old, (twice, old)
print(len(files))
""".replace("OLD", repr(OLD_NAMES))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    assert int(done.stdout.split()[-1]) > 80


def test_python_m_rlfleet_is_the_command_and_says_its_version(tmp_path):
    done = subprocess.run([sys.executable, "-m", "rlfleet", "--version"], capture_output=True,
                          text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.startswith("rlfleet "), done.stderr
    import rlfleet

    assert done.stdout.split()[1] == rlfleet.__version__


def test_the_ready_runs_ship_in_the_package_and_load_by_name(tmp_path, monkeypatch):
    from rlfleet.shared.run.config import config_path, load_config, packaged_configs

    monkeypatch.chdir(tmp_path)  # nowhere near the repository's configs/
    shipped = packaged_configs()
    assert shipped == sorted(p.stem for p in (REPO / "configs").glob("*.yaml"))
    assert load_config("cartpole-dqn") == load_config(REPO / "configs" / "cartpole-dqn.yaml")
    assert load_config("cartpole-ppo.yaml").algo.name == "ppo"
    assert config_path("no-such-run").name == "no-such-run"


def test_an_unknown_config_name_lists_the_packaged_ones(tmp_path):
    done = subprocess.run([sys.executable, "-m", "rlfleet", "check", "--config", "nope"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 2
    assert "no packaged config is named so" in done.stderr and "cartpole-dqn" in done.stderr


def test_the_package_is_typed():
    assert (REPO / "services" / "py.typed").is_file()
    assert "py.typed" in _setuptools()["package-data"]["rlfleet"]


def test_every_public_name_resolves():
    import rlfleet

    for name in rlfleet.__all__:
        assert getattr(rlfleet, name) is not None, name
    assert rlfleet.load_config("cartpole-dqn").algo.name == "dqn"


def test_make_test_runs_every_suite_pytest_knows():
    """`make test` runs the unit suite on its own (two workers) and the rest after it: the
    suites it names must be pyproject's `testpaths`, in their order, so a new suite is not
    left out of CI."""
    paths = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"][
        "ini_options"]["testpaths"]
    makefile = (REPO / "Makefile").read_text()
    suites = re.search(r"^SUITES = (.+)$", makefile, re.M)
    assert suites is not None
    assert ["tests/unit", *suites.group(1).split()] == paths
    assert "-n 2 tests/unit" in makefile
    # the suites on two workers, then the tests that must run alone: between them, every test
    assert "-m 'not slow and not alone' $(SUITES)" in makefile
    assert "-m 'alone and not slow' $(SUITES)" in makefile
