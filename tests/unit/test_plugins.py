"""The one loader of import-path plug-ins (`rlfleet.shared.contract.plugins`): a kind checks
a class once, against protocols, and refuses what satisfies nothing with an error naming the
field; what users subclass is exported from `rlfleet`; modules that moved answer to their
old names with one warning."""

from __future__ import annotations

import ast
import importlib
import sys
import warnings
from pathlib import Path
from typing import Protocol, runtime_checkable

import pytest

import rlfleet
from rlfleet.shared.contract.config import ConfigError
from rlfleet.shared.contract.plugins import PluginKind, load_plugin, make_plugin
from rlfleet.shared.util import imports
from rlfleet.shared.util.imports import RlfleetDeprecationWarning

REPO = Path(__file__).resolve().parents[2]


@runtime_checkable
class Sings(Protocol):
    def sing(self) -> str: ...


@runtime_checkable
class Dances(Protocol):
    def dance(self) -> str: ...


class Singer:
    def __init__(self, song: str = "la") -> None:
        self.song = song

    def sing(self) -> str:
        return self.song


class Mute:
    pass


class Broken:
    def __init__(self) -> None:
        raise RuntimeError("no stage")

    def sing(self) -> str:
        return ""


NOT_A_CLASS = 3
PERFORMER = PluginKind("performer", any_of=(Sings, Dances), any_of_label="acts",
                       subclass="Singer")
SINGER = PluginKind("singer", required=(Sings,))


def test_a_class_of_the_kind_loads_and_is_made_with_its_params():
    cls = load_plugin(f"{__name__}:Singer", "show.acts[0]", PERFORMER)
    assert cls is Singer
    made = make_plugin(cls, "show.acts[0]", song="hey")
    assert isinstance(made, Sings) and not isinstance(made, Dances) and made.sing() == "hey"


@pytest.mark.parametrize(("path", "kind", "says"), [
    ("Mute", PERFORMER, "show.acts[0]='{mod}:Mute' is not a performer class: it has none "
                        "of the acts sing, dance (subclass Singer)"),
    ("Mute", SINGER, "show.acts[0]='{mod}:Mute' is not a singer class: it lacks sing"),
    ("NOT_A_CLASS", SINGER, "is not a singer class: it names a int, not a class"),
    ("Nobody", SINGER, "module '{mod}' has no attribute 'Nobody'"),
])
def test_what_satisfies_nothing_is_refused_naming_the_field(path, kind, says):
    with pytest.raises(ConfigError) as err:
        load_plugin(f"{__name__}:{path}", "show.acts[0]", kind)
    assert says.format(mod=__name__) in str(err.value)
    assert str(err.value).startswith("show.acts[0]=")


def test_making_one_that_fails_names_the_field():
    with pytest.raises(ConfigError, match=r"show.acts\[1\].params: .*Singer does not take"):
        make_plugin(Singer, "show.acts[1]", colour="red")
    with pytest.raises(ConfigError, match=r"show.acts\[1\]=.*Broken': making it failed: "
                                          r"RuntimeError: no stage"):
        make_plugin(Broken, "show.acts[1]")


def test_a_callable_kind_takes_functions_too():
    env = PluginKind("env", callable_ok=True)
    assert load_plugin("rlfleet.shared.envs.bitflip:BitFlipEnv", "env.id", env)
    with pytest.raises(ConfigError, match="is not a class or a callable"):
        load_plugin(f"{__name__}:NOT_A_CLASS", "env.id", env)


def test_what_users_subclass_is_exported_from_rlfleet():
    from rlfleet.shared.algos.hooks import HookContext, LearnerHook
    from rlfleet.shared.contract.commander import BaseCommander, TaskEnvSettings
    from rlfleet.shared.telemetry.log_writers import MetricWriter, VideoWriter

    assert (rlfleet.LearnerHook, rlfleet.HookContext, rlfleet.BaseCommander,
            rlfleet.TaskEnvSettings, rlfleet.MetricWriter, rlfleet.VideoWriter) == (
        LearnerHook, HookContext, BaseCommander, TaskEnvSettings, MetricWriter, VideoWriter)
    assert {"LearnerHook", "HookContext", "BaseCommander", "MetricWriter",
            "VideoWriter"} <= set(rlfleet.__all__)


def test_a_moved_module_answers_to_its_old_name_with_one_warning(monkeypatch):
    monkeypatch.setitem(imports.RENAMED_MODULES, "rlfleet.shared.util.old_backoff",
                        "rlfleet.shared.util.backoff")
    monkeypatch.setattr(imports, "_warned", set())
    monkeypatch.delitem(sys.modules, "rlfleet.shared.util.old_backoff", raising=False)
    with pytest.warns(RlfleetDeprecationWarning,
                      match="rlfleet.shared.util.old_backoff moved: import "
                            "rlfleet.shared.util.backoff"):
        old = importlib.import_module("rlfleet.shared.util.old_backoff")
    assert old is importlib.import_module("rlfleet.shared.util.backoff")
    assert old.__name__ == "rlfleet.shared.util.backoff"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from rlfleet.shared.util.old_backoff import Backoff  # noqa: F401 - once only
    sys.modules.pop("rlfleet.shared.util.old_backoff", None)


PLUGIN_WORDS = ("hook", "writer", "commander", "plugin", "model", "bot")


def test_no_plug_in_is_probed_by_attribute_name():
    """What a plug-in can do is asked with `isinstance` against a protocol, once; the loader's
    own lookup of the import path (`shared/util/imports.py`) is the one `getattr`."""
    found = []
    for folder in ("services", "shared", "coordinator", "collector", "learner"):
        for path in (REPO / folder).rglob("*.py"):
            if path == REPO / "shared" / "util" / "imports.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                        and node.func.id in ("getattr", "hasattr") and node.args:
                    target = ast.unparse(node.args[0]).lower()
                    if any(w in target for w in PLUGIN_WORDS):
                        found.append(f"{path.relative_to(REPO)}:{node.lineno}: "
                                     f"{ast.unparse(node)}")
    assert not found, "plug-ins probed by name:\n" + "\n".join(found)
