"""The type check's package layout (`.ci/typecheck.py`, `make lint`): mypy reads `rlfleet` from
a tree of links built from pyproject's package-dir, so every folder of the package must be
in it under its import name. A new role folder added to package-dir is in the check at once;
one the builder cannot lay out fails here, without running mypy."""

from __future__ import annotations

import importlib.util
import tomllib
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


def typecheck() -> ModuleType:
    spec = importlib.util.spec_from_file_location("typecheck", REPO / ".ci" / "typecheck.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def setuptools() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_every_module_of_every_package_dir_entry_is_in_the_tree(tmp_path):
    tc = typecheck()
    package_dir = setuptools()["package-dir"]
    assert tc.package_dirs(REPO) == package_dir
    tc.build_tree(REPO, tmp_path)
    missing = []
    for name, folder in package_dir.items():
        for source in (REPO / folder).rglob("*.py"):
            rel = source.relative_to(REPO / folder)
            # a sub-folder that package-dir maps to a package of its own is that one's
            inner = ".".join([name, *rel.parent.parts])
            if inner != name and any(inner == other or inner.startswith(other + ".")
                                     for other in package_dir if other.startswith(name + ".")):
                continue
            linked = tmp_path.joinpath(*name.split("."), rel)
            if not linked.is_file() or linked.resolve() != source.resolve():
                missing.append(f"{name}: {folder}/{rel}")
    assert not missing, f"not in the type-check tree: {missing}"


def test_every_package_listed_for_the_wheel_is_a_package_of_the_tree(tmp_path):
    tc = typecheck()
    tc.build_tree(REPO, tmp_path)
    absent = [pkg for pkg in setuptools()["packages"]
              if not tmp_path.joinpath(*pkg.split("."), "__init__.py").is_file()]
    assert not absent, absent


def test_a_second_build_keeps_the_links_and_drops_what_left_the_package(tmp_path):
    tc = typecheck()
    tc.build_tree(REPO, tmp_path)
    kept = tmp_path / "rlfleet" / "coordinator"
    stale = tmp_path / "rlfleet" / "gone.py"
    stale.symlink_to(REPO / "services" / "__init__.py")
    before = kept.lstat().st_ino
    tc.build_tree(REPO, tmp_path)
    assert kept.lstat().st_ino == before and not stale.is_symlink()


@pytest.mark.parametrize("package_dir, message", [
    ({"rlfleet": "services", "other": "shared"}, "one root package"),
    ({"rlfleet": "services", "rlfleet.shared.deep": "shared"}, "one level below"),
    ({"rlfleet": "services", "rlfleet.local": "shared"}, "collides with services/local"),
])
def test_a_layout_the_tree_cannot_hold_is_named(package_dir, message):
    with pytest.raises(ValueError, match=message):
        typecheck().links(package_dir, REPO)


def test_what_mypy_says_names_the_real_files(tmp_path):
    tc = typecheck()
    tc.build_tree(REPO, tmp_path / "build" / "typecheck")
    said = "build/typecheck/rlfleet/coordinator/membership.py:12: error: x  [attr-defined]"
    assert tc.real_path(said, tmp_path) == "coordinator/membership.py:12: error: x  [attr-defined]"
    assert tc.real_path("build/typecheck/rlfleet/cli.py: note: y", tmp_path) == \
        "services/cli.py: note: y"
    summary = "Success: no issues found in 263 source files"
    assert tc.real_path(summary, tmp_path) == summary
