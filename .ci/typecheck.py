#!/usr/bin/env python3
"""Type-check the `rlfleet` package with mypy (`make lint`; configuration in pyproject.toml).

`rlfleet` is assembled from folders (pyproject's `[tool.setuptools.package-dir]`: `services/`
is `rlfleet`, `coordinator/` is `rlfleet.coordinator`, ...). The editable install maps them
with an import hook that no static checker sees, so this script lays the package out as a
tree of symbolic links, `build/typecheck/rlfleet/`, rebuilt from package-dir at every run so
that it never drifts from the install: every entry of the root package's folder, and each
sub-package's folder under its last name. mypy finds it through `mypy_path` and reports the
linked paths; this script prints them as the files they link to (`coordinator/x.py:3: ...`).

    python .ci/typecheck.py [MYPY ARGS]   # build the tree, run mypy, name the real files
    python .ci/typecheck.py --tree        # build the tree only (editors, `python -m mypy`)
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TREE = Path("build") / "typecheck"
# A mypy line that starts with a path inside the tree: `build/typecheck/rlfleet/x.py:3: ...`.
TREE_PATH = re.compile(r"^(?P<path>[^:\s]*build/typecheck/[^:\s]+\.pyi?)(?P<rest>:.*)?$")


def package_dirs(repo: Path = REPO) -> dict[str, str]:
    """pyproject's package-dir: import name -> folder, relative to the repository."""
    pyproject = tomllib.loads((repo / "pyproject.toml").read_text())
    return dict(pyproject["tool"]["setuptools"]["package-dir"])


def links(package_dir: dict[str, str], repo: Path = REPO) -> dict[Path, str]:
    """Where each link of the tree goes: its path under the tree -> the folder or file it
    names, relative to the repository.

    One root package whose folder's entries are linked one by one (so that its sub-packages
    can sit beside them), and sub-packages one level below it, each linked whole."""
    roots = [name for name in package_dir if "." not in name]
    if len(roots) != 1:
        raise ValueError(f"package-dir: expected one root package, found {roots}")
    (root,) = roots
    folder = package_dir[root]
    out: dict[Path, str] = {}
    for entry in sorted((repo / folder).iterdir()):
        if entry.name != "__pycache__":
            out[Path(root) / entry.name] = f"{folder}/{entry.name}"
    for name, sub in package_dir.items():
        if name == root:
            continue
        parent, _, last = name.rpartition(".")
        if parent != root:
            raise ValueError(f"package-dir: {name!r} is not one level below {root!r}; "
                             f"the type-check tree links sub-packages of the root only")
        if Path(root) / last in out:
            raise ValueError(f"package-dir: {name!r} ({sub}/) collides with "
                             f"{folder}/{last} of the root package")
        out[Path(root) / last] = sub
    return out


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)  # unlinks the links inside, never follows them


def build_tree(repo: Path = REPO, tree: Path = TREE) -> dict[Path, str]:
    """Bring the tree under `repo / tree` up to date (relative links; a link already right
    is left alone, so an editor reading the tree never sees it gone), and return its links."""
    planned = links(package_dirs(repo), repo)
    base = repo / tree
    wanted = {base / link: os.path.relpath(repo / target, (base / link).parent)
              for link, target in planned.items()}
    for root in {base / link.parts[0] for link in planned}:
        if root.is_symlink() or root.is_file():
            root.unlink()
        root.mkdir(parents=True, exist_ok=True)
        for entry in root.iterdir():
            if entry not in wanted:  # gone from the package since the last run
                _remove(entry)
    for path, target in wanted.items():
        if path.is_symlink() and os.readlink(path) == target:
            continue
        _remove(path)
        path.symlink_to(target)
    return planned


def real_path(line: str, cwd: Path = REPO) -> str:
    """The line with a leading tree path (relative to `cwd`, where mypy ran) replaced by the
    file it links to, relative to the repository."""
    m = TREE_PATH.match(line)
    if not m:
        return line
    target = Path(os.path.realpath(cwd / m["path"]))
    try:
        shown = str(target.relative_to(REPO))
    except ValueError:
        shown = str(target)
    return shown + (m["rest"] or "")


def main(argv: list[str]) -> int:
    build_tree()
    if argv[:1] == ["--tree"]:
        print(f"type-check tree: {TREE / 'rlfleet'}")
        return 0
    proc = subprocess.Popen([sys.executable, "-m", "mypy", *argv], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        print(real_path(line.rstrip("\n")), flush=True)
    return proc.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
