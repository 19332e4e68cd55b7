"""The torch range and the pins: pyproject declares a range so that installing rlfleet keeps
a user's torch; it must admit the releases checked (2.11 on the GPU machines, 2.13.0 in CI,
2.14.1 by `make test-py313`), each constraints file's pin, and the torch this suite runs;
make and the image install with the pin (README, "Pythons and torch")."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import torch
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

REPO = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def torch_range() -> SpecifierSet:
    (req,) = [Requirement(d) for d in PROJECT["dependencies"] if Requirement(d).name == "torch"]
    assert req.marker is None and not req.extras
    return req.specifier


def pins(name: str) -> dict[str, str]:
    """`package==version` lines of constraints/NAME."""
    found = {}
    for line in (REPO / "constraints" / name).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            (spec,) = req.specifier
            assert spec.operator == "==", line
            found[req.name] = spec.version
    return found


@pytest.mark.parametrize("version", ["2.11.0", "2.13.0", "2.13.0+cpu", "2.14.0", "2.14.1"])
def test_the_range_admits_every_release_checked(version):
    assert torch_range().contains(version), f"{torch_range()} refuses torch {version}"


@pytest.mark.parametrize("version", ["2.15.0", "2.15.0rc1", "3.0.0", "2.3.1"])
def test_the_range_stops_at_the_newest_tested_and_the_oldest_with_its_apis(version):
    assert not torch_range().contains(version, prereleases=True)


@pytest.mark.parametrize("name", ["pinned.txt", "newest.txt"])
def test_each_constraints_pin_lies_inside_the_range(name):
    assert torch_range().contains(pins(name)["torch"])


def test_the_pins_differ_and_the_range_ends_after_the_newest():
    """`make test-py313` checks what CI does not, the newest release tested; the range
    stops right after that release's minor version."""
    pinned, newest = pins("pinned.txt")["torch"], pins("newest.txt")["torch"]
    assert pinned != newest
    major, minor = (int(n) for n in newest.split(".")[:2])
    assert not torch_range().contains(f"{major}.{minor + 1}.0")


def test_the_torch_running_this_suite_lies_inside_the_range():
    assert torch_range().contains(torch.__version__), torch.__version__


def test_requires_python_admits_3_11_to_3_13():
    pythons = SpecifierSet(PROJECT["requires-python"])
    for version in ("3.11.0", "3.12.0", "3.13.0"):
        assert pythons.contains(version), version
    assert not pythons.contains("3.10.13")


def test_make_and_the_image_install_with_the_pin():
    makefile = (REPO / "Makefile").read_text()
    assert "CONSTRAINTS ?= constraints/pinned.txt" in makefile
    assert makefile.count("$(PIP_INSTALL)") >= 2  # both venv targets (and `make docs`)
    assert "-c constraints/newest.txt" in makefile  # `make test-py313`
    dockerfile = (REPO / "services" / "Dockerfile").read_text()
    assert "COPY constraints/pinned.txt" in dockerfile
