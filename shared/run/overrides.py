"""Dotted overrides of a config's fields, as a command line or a sweep gives them:
`algo.lr=3e-4 collector.num_envs=16 learner.mix='[{buffer: replay, fraction: 1.0}]'`.

Each item is `dotted.key=value`, the value YAML (so numbers, booleans, `null`, lists and
mappings are what they look like). They are applied to the config's raw data before it is
validated, so the config's own models check them and name the field they are about, exactly
as for a field written in the file.

Numbers are read as YAML 1.2 reads them: PyYAML follows YAML 1.1, where `3e-4` and `1e5` (no
dot) are strings, which is how a learning rate is usually written on a command line.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Any

import yaml

from rlfleet.shared.contract.config import ConfigError

# YAML 1.2's float: what YAML 1.1 adds to it (a dot is needed there) is read as a float too.
_FLOAT_12 = re.compile(r"^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$")
_KEY_PART = re.compile(r"^[A-Za-z0-9_-]+$")


class _Loader(yaml.SafeLoader):
    """`yaml.safe_load` with YAML 1.2's numbers."""


class _Dumper(yaml.SafeDumper):
    """`yaml.safe_dump` that quotes a string `_Loader` would read as a number."""


for _cls in (_Loader, _Dumper):
    _cls.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_12, list("-+0123456789."))
_Dumper.add_representer(tuple, lambda dumper, data: dumper.represent_list(list(data)))
_Dumper.add_representer(str, lambda dumper, data: dumper.represent_scalar(
    "tag:yaml.org,2002:str", data, style='"' if "\n" in data else None))


def parse_value(text: str) -> Any:
    """An override's value: YAML, its numbers as YAML 1.2 reads them. Raises `ValueError`."""
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError as err:
        raise ValueError(f"not valid YAML: {' '.join(str(err).split())}") from None


def parse_override(item: str) -> tuple[str, Any]:
    """`key=value` as its dotted key and its value. Raises `ConfigError` naming the item."""
    key, sep, text = item.partition("=")
    key = key.strip()
    if not sep:
        raise ConfigError(f"override {item!r}: expected KEY=VALUE (for example algo.lr=3e-4)")
    check_key(key, item)
    try:
        return key, parse_value(text)
    except ValueError as err:
        raise ConfigError(f"override {item!r}: {err}") from None


def check_key(key: str, item: str | None = None) -> None:
    """A dotted key: names separated by dots, each letters, digits, `_` or `-`."""
    what = f"override {item!r}" if item is not None else f"override key {key!r}"
    if not key:
        raise ConfigError(f"{what}: the key before '=' is empty (expected KEY=VALUE, for "
                          "example algo.lr=3e-4)")
    if not all(_KEY_PART.match(part) for part in key.split(".")):
        raise ConfigError(f"{what}: a key is field names joined by dots (algo.lr, "
                          "buffers.replay.capacity)")


def parse_overrides(items: Iterable[str] | Mapping[str, Any] | None) -> dict[str, Any]:
    """Overrides as `{dotted key: value}`, in the order given (a later one of the same key
    wins): from `key=value` strings, or a mapping whose keys are checked and whose values are
    taken as they are. Raises `ConfigError` naming a malformed item."""
    if items is None:
        return {}
    if isinstance(items, Mapping):
        out: dict[str, Any] = {}
        for key, value in items.items():
            if not isinstance(key, str):
                raise ConfigError(f"override key {key!r}: expected a dotted string")
            check_key(key)
            out[key] = value
        return out
    if isinstance(items, str):
        raise ConfigError(f"overrides: expected KEY=VALUE items, not one string {items!r}")
    out = {}
    for item in items:
        if not isinstance(item, str):
            raise ConfigError(f"override {item!r}: expected a 'key=value' string")
        key, value = parse_override(item)
        out[key] = value
    return out


def format_value(value: Any) -> str:
    """A value as an override writes it: YAML in flow style, on one line, that
    `parse_value` reads back as the same value."""
    if isinstance(value, float) and not math.isfinite(value):
        return ".nan" if math.isnan(value) else (".inf" if value > 0 else "-.inf")
    try:
        text = yaml.dump(value, Dumper=_Dumper, default_flow_style=True, width=math.inf,
                         sort_keys=False)
    except yaml.representer.RepresenterError:
        raise ConfigError(f"override value {value!r}: a {type(value).__name__} is no YAML "
                          "value (give numbers, strings, booleans, None, lists or dicts)"
                          ) from None
    return text.strip().removesuffix("\n...").rstrip()  # a lone scalar's document end


def format_override(key: str, value: Any) -> str:
    """`key=value`, the command line's form of one override, which `parse_override` reads
    back as the same key and value (the Python API hands its overrides to `rlfleet up`)."""
    check_key(key)
    return f"{key}={format_value(value)}"


def apply_overrides(data: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a config's raw data with each dotted key set to its value. A section the
    data lacks (or holds as null) is created; a list is indexed by number
    (`learner.mix.0.fraction`). Whether a key names a real field is the config's models' to
    say; a key that goes through a value that has no fields (`env.id.x`) is a `ConfigError`."""
    out = _copy(data)
    for key, value in overrides.items():
        parts = key.split(".")
        node: Any = out
        for depth, part in enumerate(parts[:-1]):
            node = _child(node, part, parts, depth, key, value)
        _set(node, parts[-1], parts, key, value)
    return out


def _child(node: Any, part: str, parts: list[str], depth: int, key: str, value: Any) -> Any:
    if isinstance(node, list):
        child = node[_index(node, part, parts, depth, key, value)]
    else:
        if node.get(part) is None:
            node[part] = {}
        child = node[part]
    if not isinstance(child, (dict, list)):
        where = ".".join(parts[:depth + 1])
        raise ConfigError(f"override {key}={format_value(value)}: {where} is {child!r}, "
                          f"which has no field {parts[depth + 1]!r}")
    return child


def _set(node: Any, part: str, parts: list[str], key: str, value: Any) -> None:
    if isinstance(node, list):
        node[_index(node, part, parts, len(parts) - 1, key, value)] = value
    else:
        node[part] = value


def _index(node: list, part: str, parts: list[str], depth: int, key: str, value: Any) -> int:
    where = ".".join(parts[:depth]) or "(root)"
    if not part.isdigit() or int(part) >= len(node):
        raise ConfigError(f"override {key}={format_value(value)}: {where} is a list of "
                          f"{len(node)}; index it by 0 to {len(node) - 1}, not {part!r}")
    return int(part)


def _copy(data: Any) -> Any:
    """Dicts and lists copied all the way down (tuples become lists, as in YAML)."""
    if isinstance(data, Mapping):
        return {k: _copy(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_copy(v) for v in data]
    return data


def touches(key: str, field: str) -> bool:
    """Whether overriding `key` may change dotted `field`: the same field, a field inside
    it, or a section holding it."""
    return key == field or key.startswith(field + ".") or field.startswith(key + ".")


def value_at(data: Any, field: str) -> Any:
    """The value at a dotted path of plain data; None where there is none."""
    for part in field.split("."):
        if isinstance(data, Mapping):
            data = data.get(part)
        elif isinstance(data, list) and part.isdigit() and int(part) < len(data):
            data = data[int(part)]
        else:
            return None
    return data
