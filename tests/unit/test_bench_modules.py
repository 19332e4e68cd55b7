"""The benches are a package of modules run from the repository root (`python -m
bench.<name>`): none edits `sys.path` to find its neighbours. A path edit makes an import work
for whoever runs the file one way and hides that it fails another way (a subprocess, a test,
gunicorn importing `bench.coordinator_servers`), so it is not let back in unnoticed."""

from __future__ import annotations

import re
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
# `sys.path.insert(...)`, `.append(...)`, `.extend(...)`, `sys.path += ...`, `sys.path = ...`
PATH_EDIT = re.compile(r"\bsys\.path\s*(\.\s*(insert|append|extend)\s*\(|\+=|=(?!=))")


def path_edits(root: Path) -> list[str]:
    """`file:line` of every line under `root` that edits `sys.path`."""
    return [f"{path.relative_to(root.parent)}:{number}"
            for path in sorted(root.rglob("*.py"))
            for number, line in enumerate(path.read_text().splitlines(), 1)
            if PATH_EDIT.search(line)]


def test_no_bench_edits_sys_path():
    edits = path_edits(BENCH)
    assert not edits, (f"sys.path edited in {edits}: import through the `bench` package "
                       "and run the bench as `python -m bench.<name>` from the repository root")


def test_the_guard_sees_each_kind_of_edit(tmp_path):
    """The pattern is what the test rests on: it must see every way of editing the path,
    and not a read of it."""
    bench = tmp_path / "bench"
    bench.mkdir()
    (bench / "edits.py").write_text(
        "import sys\n"
        "sys.path.insert(0, '/x')\n"
        "sys.path.append('/x')\n"
        "sys.path.extend(['/x'])\n"
        "sys.path += ['/x']\n"
        "sys.path = ['/x']\n")
    (bench / "reads.py").write_text(
        "import sys\n"
        "found = [p for p in sys.path if p]\n"
        "same = sys.path == []\n")
    assert path_edits(bench) == [f"bench/edits.py:{n}" for n in range(2, 7)]
