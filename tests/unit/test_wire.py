"""The wire schemas live in `rlfleet.shared.contract.wire`; `rlfleet.shared.contract.schemas`
stays only for code written against it: it resolves every name it used to define, to the
very same object, with one warning per name naming the module to import from, and nothing
in rlfleet imports it."""

from __future__ import annotations

import importlib
import warnings

import pytest

from rlfleet.shared.contract import schemas
from rlfleet.shared.contract.wire.experience import ChunkMeta
from rlfleet.shared.util.imports import RlfleetDeprecationWarning

from .test_layers import imports_of, modules

OLD = "rlfleet.shared.contract.schemas"


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(schemas, "_warned", set())


def test_no_module_of_the_package_imports_the_old_module():
    mods = modules()
    found = [f"{name}:{line}" for name, path in mods.items() if name != OLD
             for target, line in imports_of(path, set(mods)) if target == OLD]
    assert not found, f"import from rlfleet.shared.contract.wire instead: {found}"


def test_the_old_module_resolves_a_name_with_one_warning_naming_its_module():
    with pytest.warns(RlfleetDeprecationWarning,
                      match=f"{OLD} is deprecated: import ChunkMeta from "
                            "rlfleet.shared.contract.wire.experience"):
        from rlfleet.shared.contract.schemas import ChunkMeta as old
    assert old is ChunkMeta
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert schemas.ChunkMeta is ChunkMeta  # once per name


def test_every_old_name_is_the_object_its_module_defines():
    for name, module in schemas.MODULE_OF.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RlfleetDeprecationWarning)
            assert getattr(schemas, name) is getattr(importlib.import_module(module), name)
    assert "ChunkMeta" in dir(schemas)
    with pytest.raises(AttributeError, match="has no attribute 'NoSuchThing'"):
        schemas.NoSuchThing  # noqa: B018
