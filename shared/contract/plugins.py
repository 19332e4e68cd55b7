"""One loader for everything a config names by import path: learner hooks, metric writers,
commanders, reward models, policies, envs, bots, and any kind added later.

A *kind* says what the named object must be: a class that satisfies some small
`runtime_checkable` protocols (every one of `required`, at least one of `any_of`), or any
callable. The loader imports the path, checks the object against its kind once, and
answers either the object or a `ConfigError` that names the config field and what is
missing, so a launch refuses it (exit 2) before anything starts. What a plug-in may
optionally do is a protocol too, asked with `isinstance` once where the plug-in is made;
nothing probes a plug-in's attributes by name per call.

    HOOK = PluginKind("learner hook", any_of=(BeforeRun, AfterIter, ...),
                      subclass="rlfleet.LearnerHook")
    cls = load_plugin("my_pkg.hooks:Watch", "learner.hooks[0]", HOOK)
    hook = make_plugin(cls, "learner.hooks[0]", every=100)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlfleet.shared.contract.config import ConfigError
from rlfleet.shared.util.imports import ImportPathError, load_object


@dataclass(frozen=True)
class PluginKind:
    """What a config field may name.

    - `label`: how errors call it ("learner hook", "metric writer");
    - `required`: protocols the class must satisfy, all of them;
    - `any_of`: protocols of which it must satisfy at least one (a hook's stages);
    - `subclass`: the base users subclass, named in errors (`rlfleet.LearnerHook`);
    - `callable_ok`: a function or other callable is accepted as well as a class (env and
      bot factories); its protocols are then not checked;
    - `any_of_label`: what errors call the members of `any_of` ("stages");
    - `extra_check`: the members a class lacks beyond the protocols' (a policy's check,
      which knows which of `Policy`'s attributes are set in `__init__`).

    A class satisfies a protocol when it (or a base other than `object`) defines each of
    the protocol's members: the check reads the class, never calls or probes it.
    """

    label: str
    required: tuple[type, ...] = ()
    any_of: tuple[type, ...] = ()
    subclass: str | None = None
    callable_ok: bool = False
    any_of_label: str = "members"  # what errors call `any_of`'s members ("stages")
    extra_check: Callable[[type], list[str]] | None = None  # more members it lacks

    def problem(self, obj: Any) -> str | None:
        """Why `obj` is not of this kind, or None."""
        if not isinstance(obj, type):
            if self.callable_ok and callable(obj):
                return None
            if self.callable_ok:
                return f"is not a class or a callable (it names a {type(obj).__name__})"
            return f"is not a {self.label} class: it names a {type(obj).__name__}, not a class"
        missing = [m for p in self.required for m in lacking(obj, p)]
        if self.extra_check is not None:
            missing += self.extra_check(obj)
        if missing:
            return f"is not a {self.label} class: it lacks {', '.join(missing)}"
        if self.any_of and all(lacking(obj, p) for p in self.any_of):
            names = ", ".join(m for p in self.any_of for m in members(p))
            return (f"is not a {self.label} class: it has none of the {self.any_of_label} "
                    f"{names}")
        return None

    def hint(self) -> str:
        return f" (subclass {self.subclass})" if self.subclass else ""


def load_plugin(path: str, field: str, kind: PluginKind) -> Any:
    """The class (or callable) `path` names, checked against `kind`; a `ConfigError`
    naming `field` when it does not import or is not of the kind."""
    try:
        obj = load_object(path, field)
    except ImportPathError as err:
        raise ConfigError(str(err)) from None
    why = kind.problem(obj)
    if why:
        raise ConfigError(f"{field}={path!r} {why}{kind.hint()}")
    return obj


def make_plugin(factory: Callable[..., Any], field: str, *args: Any, **kwargs: Any) -> Any:
    """`factory(*args, **kwargs)`; arguments it does not take are a `ConfigError` naming
    `field`'s params, and any other failure one naming `field`."""
    try:
        return factory(*args, **kwargs)
    except TypeError as err:
        raise ConfigError(f"{field}.params: {describe(factory)} does not take them: "
                          f"{err}") from None
    except ConfigError:
        raise
    except Exception as err:
        raise ConfigError(f"{field}={describe(factory)!r}: making it failed: "
                          f"{type(err).__name__}: {err}") from None


def describe(obj: Any) -> str:
    """`module:Name` of a class or function, for messages."""
    module = obj.__module__ if isinstance(obj, type) else type(obj).__module__
    name = obj.__qualname__ if isinstance(obj, type) else type(obj).__qualname__
    return f"{module}:{name}"


def members(proto: type) -> list[str]:
    """The public names a protocol declares (its methods, properties and attributes)."""
    names = [n for n, v in vars(proto).items() if not n.startswith("_")
             and (callable(v) or isinstance(v, property))]
    names += [n for n in vars(proto).get("__annotations__", {}) if not n.startswith("_")]
    return sorted(set(names))


def declared(cls: type, name: str) -> bool:
    """Whether `cls` itself (or a base other than `object`) defines `name`, as a method,
    a property or a class attribute, or names it in an annotation."""
    return any(name in vars(klass) or name in vars(klass).get("__annotations__", {})
               for klass in cls.__mro__[:-1])


def lacking(cls: type, proto: type) -> list[str]:
    """The members of `proto` that `cls` does not define."""
    return [n for n in members(proto) if not declared(cls, n)]
