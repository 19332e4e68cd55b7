"""MkDocs hooks: the reference pages, generated from the code at every build.

Nothing here is committed as Markdown: `mkdocs build` asks the code, so the pages cannot
drift from it.

- `reference/config.md`: every field of `RunConfig` and its sections, of each algorithm's
  config (`ALGORITHMS`) and of each reward model's settings (`REWARD_MODELS`), with its type,
  default, bounds and description (the pydantic `Field(description=...)`);
- `reference/http.md`: the coordinator's OpenAPI document (`openapi_document`), from an app
  built with a ready config and a temporary storage directory, never started;
- `reference/cli.md`: the `rlfleet` command's sub-commands and options (its argparse parser);
- `results.md`: `bench/RESULTS.md` as it is, and `figures/*.png` from `bench/figures/`;
- markers in hand-written pages, replaced where they stand: `<!-- rlfleet:layers -->` (the
  table of allowed imports, `LAYERS` in tests/unit/test_layers.py),
  `<!-- rlfleet:algorithms -->` (what each registered algorithm says of itself),
  `<!-- rlfleet:capabilities -->` (the optional policy capabilities) and
  `<!-- rlfleet:configs -->` (the ready runs in configs/).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import inspect
import json
import logging
import os
import re
import sys
import tempfile
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

log = logging.getLogger("mkdocs.hooks.rlfleet")

GENERATED = ("reference/config.md", "reference/http.md", "reference/cli.md", "results.md")
MARKER = re.compile(r"<!-- rlfleet:([a-z-]+) -->")


def _repo(config: Any) -> Path:
    return Path(config.config_file_path).resolve().parent


# -- Markdown helpers ---------------------------------------------------------------------

_CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)


def md(text: str | None) -> str:
    """Prose from the code (a description, a docstring) as Markdown inside a table cell:
    code spans kept, everything else escaped so that `<run-dir>`, `|` and `_` stay text."""
    if not text:
        return ""
    out, pos = [], 0
    for m in _CODE_SPAN.finditer(text):
        out.append(_escape(text[pos:m.start()]))
        out.append(m.group(0))
        pos = m.end()
    out.append(_escape(text[pos:]))
    return " ".join("".join(out).split())


def _escape(s: str) -> str:
    for ch in "\\*_|[]":
        s = s.replace(ch, "\\" + ch)
    return s.replace("<", "&lt;").replace(">", "&gt;")


def code(text: str) -> str:
    """`text` as one code span, whatever backticks it holds."""
    fence = "``" if "`" in text else "`"
    pad = " " if "`" in text else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def first_paragraph(doc: str | None) -> str:
    if not doc:
        return ""
    return inspect.cleandoc(doc).split("\n\n")[0]


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell or " " for cell in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9_]+", "-", text.lower()).strip("-")


# -- the configuration reference ----------------------------------------------------------

def _is_model(tp: Any) -> bool:
    from pydantic import BaseModel

    return isinstance(tp, type) and issubclass(tp, BaseModel)


def _nested(annotation: Any) -> list[tuple[str, type]]:
    """The config sections a field's annotation holds, each with the path suffix under the
    field: "" (the section itself, or null), ".<key>" (a mapping of them), "[]" (a list)."""
    if _is_model(annotation):
        return [("", annotation)]
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return _nested(args[0])
    if origin in (typing.Union, types.UnionType):
        return [item for a in args for item in _nested(a)]
    if origin is dict and len(args) == 2:
        return [(f".{_KEY_NAMES.get(args[1], '<name>')}" + s, m) for s, m in _nested(args[1])]
    if origin in (tuple, list) and args:
        return [("[]" + s, m) for s, m in _nested(args[0])]
    return []


_KEY_NAMES: dict[Any, str] = {}  # filled in lazily: the key a mapping of sections is named by


def type_text(annotation: Any) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is type(None):
        return "null"
    if annotation is typing.Any:
        return "any"
    if origin is typing.Annotated:
        return type_text(args[0])
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_text(a) for a in args)
    if origin is typing.Literal:
        return " | ".join(json.dumps(a) for a in args)
    if origin in (tuple, list):
        if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
            return f"list[{type_text(args[0])}]"
        if origin is list and args:
            return f"list[{type_text(args[0])}]"
        return "list[" + ", ".join(type_text(a) for a in args) + "]"
    if origin is dict:
        return f"dict[{type_text(args[0])}, {type_text(args[1])}]"
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def _bounds(field: Any) -> list[str]:
    out = []
    for meta in field.metadata:
        for attr, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            value = getattr(meta, attr, None)
            if value is not None:
                out.append(f"{sign} {value:,}" if isinstance(value, int) else f"{sign} {value}")
        if getattr(meta, "max_length", None) is not None:
            out.append(f"at most {meta.max_length} items")
        if getattr(meta, "pattern", None):
            out.append(f"matches {code(meta.pattern)}")
    return out


def _default_text(field: Any) -> str:
    from pydantic import BaseModel
    from pydantic_core import PydanticUndefined

    if field.is_required():
        return "required"
    value = field.default_factory() if field.default_factory is not None else field.default
    if value is PydanticUndefined:
        return "required"
    if isinstance(value, BaseModel):
        return "its section's defaults"
    return code(json.dumps(_plain(value), separators=(", ", ": ")))


def _plain(value: Any) -> Any:
    """A default as JSON would hold it; a section in it shows only what differs from the
    section's own defaults (`{"replay": {}}`: one buffer named replay, all defaults)."""
    from pydantic import BaseModel
    from pydantic_core import to_jsonable_python

    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_defaults=True)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    return to_jsonable_python(value)


def _sections(model: type, path: str, skip: frozenset[str] = frozenset()
              ) -> Iterator[tuple[str, type]]:
    """(dotted path, model) of `model` and every section below it, depth first in field
    order; `skip`: fields of `model` left to the caller."""
    yield path, model
    for name, field in model.model_fields.items():
        if name in skip:
            continue
        for suffix, sub in _nested(field.annotation):
            yield from _sections(sub, f"{path}.{name}{suffix}" if path else f"{name}{suffix}")


def _field_rows(model: type, path: str, links: dict[type, str]) -> list[list[str]]:
    rows = []
    for name, field in model.model_fields.items():
        kind = type_text(field.annotation)
        bounds = _bounds(field)
        description = md(field.description)
        subs = [(suffix, sub) for suffix, sub in _nested(field.annotation)]
        if not description and path == "algo" and name == "name":
            description = "picks this algorithm"
        see = ""
        if path == "" and name == "algo":
            see = "[the algorithms' sections](#algorithms)"
        elif subs and all(sub in links for _, sub in subs):
            see = ", ".join(f"[{code(links[sub])}](#{slug(links[sub])})" for _, sub in subs)
        if see:
            description = (description.rstrip(".") + ". " if description else "") + f"See {see}."
        rows.append([code(name), code(kind) + ("<br>" + ", ".join(bounds) if bounds else ""),
                     _default_text(field), description or "—"])
    return rows


def _section_text(title: str, anchor: str, model: type, path: str, links: dict[type, str],
                  intro: str = "") -> str:
    doc = first_paragraph(model.__doc__) if "__doc__" in vars(model) else ""
    parts = [f"### {title} {{ #{anchor} }}\n"]
    if intro:
        parts.append(intro + "\n")
    if doc:
        parts.append(md(doc) + "\n")
    parts.append(f"Model: {code(model.__module__ + '.' + model.__qualname__)}\n")
    parts.append(table(["field", "type", "default", "description"],
                       _field_rows(model, path, links)))
    return "\n".join(parts)


def config_reference() -> str:
    from rlfleet.shared.algos.registry import ALGORITHMS, REWARD_MODELS
    from rlfleet.shared.contract.config import BufferConfig, ScopeConfig
    from rlfleet.shared.run.config import RunConfig

    _KEY_NAMES.update({BufferConfig: "<name>", ScopeConfig: "<scope>"})
    out = ["# Configuration reference\n",
           "Generated from the pydantic models at every build of these pages: each field's "
           "type, default, bounds and description are the code's own. How a config is "
           "written and checked: [Configuration](../configuration.md).\n",
           "A field whose type is another section is written as a mapping under its name; "
           "`<name>` stands for a key you choose (a buffer's name), `[]` for each item of a "
           "list. Unknown keys are errors.\n"]

    # The run's own sections, in field order; then `algo`: one section per registered
    # algorithm, the sections below `algo`, and each reward model's settings.
    run_sections = list(_sections(RunConfig, "", skip=frozenset({"algo"})))
    algo_subs: dict[str, type] = {}
    for spec in ALGORITHMS.values():
        for path, model in _sections(spec.config, "algo"):
            if path != "algo":
                algo_subs.setdefault(path, model)
    links = {model: path or "top level" for path, model in run_sections}
    links.update({model: path for path, model in algo_subs.items()})

    out.append("## The run\n")
    for path, model in run_sections:
        if path == "":
            intro = ("The keys at the top of a config file. `algo` is one of the "
                     "[algorithms' sections](#algorithms) below, picked by `algo.name`.")
            out.append(_section_text("Top level", "top-level", model, path, links, intro))
            continue
        out.append(_section_text(code(path), slug(path), model, path, links))
    out.append(_algorithms_text(ALGORITHMS, REWARD_MODELS, algo_subs, links))
    return "\n".join(out)


def _algorithms_text(algorithms: dict, reward_models: dict, algo_subs: dict[str, type],
                     links: dict[type, str]) -> str:
    out = ["## Algorithms { #algorithms }\n",
           "`algo.name` picks one of these, and which settings `algo` may hold with it. "
           "What each learns from: [Algorithms](../algorithms/index.md).\n"]
    for name, spec in algorithms.items():
        anchor = f"algo-{slug(name)}"
        out.append(_section_text(f"`algo` with `name: {name}` ({spec.title})", anchor,
                                 spec.config, "algo", links))
    for path, model in algo_subs.items():
        out.append(_section_text(code(path), slug(path), model, path, links))
    for name, spec in reward_models.items():
        intro = (f"The settings of `algo.reward_model: {{path: {name}, kwargs: {{...}}}}` "
                 f"(built as {code(spec.model)}).")
        out.append(_section_text(f"`algo.reward_model.kwargs` with `path: {name}`",
                                 f"reward-model-{slug(name)}", spec.config,
                                 "algo.reward_model.kwargs", links, intro))
    return "\n".join(out)


# -- the HTTP reference -------------------------------------------------------------------

@contextlib.contextmanager
def _quiet_env(prefix: str = "RLFLEET_") -> Iterator[None]:
    """No RLFLEET_* variable of the builder's shell reaches what is generated."""
    saved = {k: v for k, v in os.environ.items() if k.startswith(prefix)}
    for k in saved:
        del os.environ[k]
    quiet = logging.getLogger("rlfleet")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        yield
    finally:
        os.environ.update(saved)
        quiet.setLevel(level)


def openapi() -> dict[str, Any]:
    """The coordinator's OpenAPI document, from an app that is built and never started."""
    from rlfleet.coordinator.app import create_app
    from rlfleet.coordinator.openapi import openapi_document
    from rlfleet.shared.run.config import load_config

    with _quiet_env(), tempfile.TemporaryDirectory(prefix="rlfleet-docs-") as tmp:
        app = create_app(load_config("cartpole-dqn"), str(Path(tmp) / "storage"),
                         Path(tmp) / "run", start=False)
        try:
            return openapi_document(app)
        finally:
            app.extensions["rlfleet"].close()


def _schema_type(s: dict[str, Any]) -> str:
    if "$ref" in s:
        name = s["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#schema-{slug(name)})"
    if "anyOf" in s or "oneOf" in s:
        return " or ".join(_schema_type(x) for x in s.get("anyOf", s.get("oneOf")))
    if "allOf" in s and len(s["allOf"]) == 1:
        return _schema_type(s["allOf"][0])
    if "const" in s:
        return code(json.dumps(s["const"]))
    if "enum" in s:
        return " or ".join(code(json.dumps(v)) for v in s["enum"])
    kind = s.get("type", "any")
    if kind == "array":
        items = s.get("items")
        if isinstance(items, dict) and items:
            return f"array of {_schema_type(items)}"
        if "prefixItems" in s:
            return "array of [" + ", ".join(_schema_type(x) for x in s["prefixItems"]) + "]"
        return "array"
    if kind == "object" and isinstance(s.get("additionalProperties"), dict):
        return f"object of {_schema_type(s['additionalProperties'])}"
    if isinstance(kind, list):
        return " or ".join(kind)
    bounds = []
    if "minimum" in s or "exclusiveMinimum" in s:
        bounds.append(f"≥ {s['minimum']}" if "minimum" in s else f"> {s['exclusiveMinimum']}")
    if "maximum" in s or "exclusiveMaximum" in s:
        bounds.append(f"≤ {s['maximum']}" if "maximum" in s else f"< {s['exclusiveMaximum']}")
    return kind + (f" ({', '.join(bounds)})" if bounds else "")


def http_reference(doc: dict[str, Any]) -> str:
    from rlfleet.shared.contract.wire.base import API

    out = ["# HTTP reference\n",
           f"The coordinator's API, generated from its OpenAPI document "
           f"({doc.get('openapi', '3')}, `{doc['info']['title']}` {doc['info']['version']}) at "
           "every build of these pages; a running coordinator serves the same document at "
           "`GET /openapi.json`. Errors, the token and what the HTTP server answers by itself: "
           "[HTTP API](../http-api.md).\n",
           md(doc["info"].get("description", "")) + "\n",
           f"Every path but `/health` is under `{API}` and needs the cluster's token when one "
           "is set. Every error answer is an [ErrorBody](#schema-errorbody).\n",
           "## Operations\n"]
    ops = [(path, method, op) for path, methods in doc["paths"].items()
           for method, op in methods.items()]
    out.append(table(["method and path", "what"], [
        [f"[{code(method.upper() + ' ' + path)}](#{slug(method + ' ' + path)})",
         md(_first_sentence(_summary(op))) or "—"]
        for path, method, op in ops]))
    for path, method, op in ops:
        out.append(f"### {code(method.upper() + ' ' + path)} {{ #{slug(method + ' ' + path)} }}\n")
        text = _summary(op)
        if text:
            out.append(md(text) + "\n")
        if not op.get("security", doc.get("security")):
            out.append("Open: no token needed.\n")
        params = op.get("parameters") or []
        if params:
            out.append(table(["parameter", "in", "type", "required", "description"], [
                [code(p["name"]), p["in"], _schema_type(p.get("schema", {})),
                 "yes" if p.get("required") else "no", md(p.get("description")) or "—"]
                for p in params]))
        body = op.get("requestBody")
        if body:
            schema = body["content"]["application/json"]["schema"]
            out.append(f"Body ({'required' if body.get('required') else 'may be left out'}): "
                       f"{_schema_type(schema)}\n")
        rows = []
        for status, resp in op.get("responses", {}).items():
            content = resp.get("content", {}).get("application/json", {})
            schema = _schema_type(content["schema"]) if content.get("schema") else "—"
            headers = ", ".join(code(h) for h in resp.get("headers", {}))
            rows.append([status, schema, md(resp.get("description")) +
                         (f" (headers: {headers})" if headers else "")])
        out.append(table(["status", "body", "when"], rows))
    out.append("## Schemas\n")
    out.append("The JSON bodies, as the pydantic models in "
               "`shared/contract/wire/` define them.\n")
    for name, schema in sorted(doc.get("components", {}).get("schemas", {}).items()):
        out.append(f"### {name} {{ #schema-{slug(name)} }}\n")
        if schema.get("description"):
            out.append(md(first_paragraph(schema["description"])) + "\n")
        props = schema.get("properties")
        if props:
            required = set(schema.get("required", []))
            out.append(table(["field", "type", "required", "default", "description"], [
                [code(prop), _schema_type(s), "yes" if prop in required else "no",
                 code(json.dumps(s["default"])) if "default" in s else "—",
                 md(s.get("description")) or "—"]
                for prop, s in props.items()]))
        elif "enum" in schema:
            out.append("One of " + ", ".join(code(json.dumps(v)) for v in schema["enum"]) + ".\n")
        else:
            out.append(f"Type: {_schema_type(schema)}.\n")
    return "\n".join(out)


# What spectree writes where a route has no docstring: `<function> <METHOD>`.
_NO_SUMMARY = re.compile(r"^\w+ <[A-Z]+>$")


def _summary(op: dict[str, Any]) -> str:
    text = " ".join(x for x in (op.get("summary"), op.get("description")) if x).strip()
    return "" if _NO_SUMMARY.match(text) else text


def _first_sentence(text: str) -> str:
    m = re.match(r"(.+?[.:;])(\s|$)", " ".join(text.split()))
    return m.group(1).rstrip(":;") if m else text


# -- the command line ---------------------------------------------------------------------

def cli_reference() -> str:
    with _quiet_env():
        from rlfleet.cli import build_parser

        parser = build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {a.dest: a.help for a in subs._choices_actions}
    out = ["# Command line\n",
           "Generated from the `rlfleet` command's own parser at every build of these pages "
           "(`python -m rlfleet` is the same command). Defaults shown are those with no "
           "`RLFLEET_*` variable set: most options can also be given as one "
           "(`--coordinator` as `RLFLEET_COORDINATOR`, and so on).\n",
           table(["command", "what"],
                 [[f"[{code('rlfleet ' + name)}](#{slug('rlfleet ' + name)})", md(helps.get(name))]
                  for name in subs.choices])]
    for name, sub in subs.choices.items():
        out.append(f"## {code('rlfleet ' + name)} {{ #{slug('rlfleet ' + name)} }}\n")
        if helps.get(name):
            out.append(md(helps[name]) + "\n")
        usage = " ".join(sub.format_usage().split()).removeprefix("usage: ")
        out.append(f"```\n{usage}\n```\n")
        rows = []
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            flags = ", ".join(action.option_strings) or action.dest
            default = action.default
            shown = ("—" if default in (None, argparse.SUPPRESS) or action.option_strings == []
                     else code(str(default)))
            rows.append([code(flags), shown, md(action.help) or "—"])
        if rows:
            out.append(table(["option", "default", "what"], rows))
    return "\n".join(out)


# -- markers in hand-written pages --------------------------------------------------------

def _load_test_module(repo: Path, rel: str) -> types.ModuleType:
    path = repo / rel
    spec = importlib.util.spec_from_file_location(f"_rlfleet_docs_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise PluginError(f"cannot load {rel}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def layers_table(repo: Path) -> str:
    layers = _load_test_module(repo, "tests/unit/test_layers.py")
    dirs = layers.package_dirs()

    def where(pkg: str) -> str:
        root = max((p for p in dirs if pkg == p or pkg.startswith(p + ".")), key=len)
        rest = pkg[len(root):].lstrip(".").replace(".", "/")
        folder = dirs[root] / rest if rest else dirs[root]
        rel = folder.relative_to(repo).as_posix()
        if folder.is_dir():
            return code(rel + "/")
        return code(rel + ".py") if folder.with_suffix(".py").is_file() else code(rel)

    rows = []
    for name, allowed in layers.LAYERS.items():
        if name in allowed:  # the package itself (`rlfleet`): everything below it
            may = "the whole package"
        else:
            may = ", ".join(code(a) for a in sorted(allowed)) or "nothing of the package"
        banned = ", ".join(code(t) for t in sorted(layers.FORBIDDEN.get(name, ()))) or "—"
        rows.append([code(name), where(name), may, banned])
    return table(["layer", "folder", "may import (besides itself and third-party packages)",
                  "must not import"], rows)


def algorithms_table() -> str:
    from rlfleet.shared.algos.registry import ALGORITHMS, REWARD_MODELS

    def caps(names: frozenset[str]) -> str:
        return ", ".join(f"[{c}](capabilities.md#{slug(c)})" for c in sorted(names)) or "—"

    rows = []
    for name, spec in ALGORITHMS.items():
        kinds = ", ".join(code(k) for k in sorted(spec.buffer_kinds))
        learns = ("whole chunks of one `queue` buffer (on-policy)" if spec.on_policy else
                  f"transitions sampled from {kinds} buffers")
        rows.append([code(name), spec.title, learns, ", ".join(sorted(spec.action_spaces)),
                     caps(spec.capabilities),
                     f"[settings](../reference/config.md#algo-{slug(name)})"])
    out = table(["`algo.name`", "algorithm", "learns from", "actions", "capabilities",
                 "settings"], rows)
    rows = [[code(name), code(spec.model), caps(spec.capabilities),
             f"[settings](../reference/config.md#reward-model-{slug(name)})"]
            for name, spec in REWARD_MODELS.items()]
    out += "\nReward models (`algo.reward_model.path`):\n\n" + table(
        ["name", "class", "capabilities", "settings"], rows)
    return out


def capabilities_text() -> str:
    from rlfleet.shared.algos.capabilities import CAPABILITIES, members

    out = []
    for cap in CAPABILITIES:
        out.append(f"### {cap.__name__} {{ #{slug(cap.__name__)} }}\n")
        out.append(md(inspect.cleandoc(cap.__doc__ or "")) + "\n")
        rows = []
        for name in members(cap):
            obj = inspect.getattr_static(cap, name, None)
            if isinstance(obj, property):
                what, doc = "property", obj.fget.__doc__ if obj.fget else ""
            elif callable(obj):
                sig = (str(inspect.signature(obj)).replace("(self, ", "(")
                       .replace("(self)", "()").replace("'", ""))
                what, doc = f"method {code(name + sig)}", obj.__doc__
            else:
                what, doc = "attribute", ""
                ann = cap.__annotations__.get(name)
                if ann is not None:
                    what = f"attribute: {code(ann if isinstance(ann, str) else type_text(ann))}"
            rows.append([code(name), what, md(first_paragraph(doc)) or "—"])
        out.append(table(["member", "kind", "what"], rows))
    return "\n".join(out)


def configs_table(repo: Path) -> str:
    from rlfleet.shared.run.config import load_config, packaged_configs

    rows = []
    for name in packaged_configs():
        cfg = load_config(repo / "configs" / f"{name}.yaml")
        algo = cfg.algo.name + (f" + {cfg.algo.reward_model.path}" if cfg.algo.reward_model
                                else "")
        kinds = ", ".join(sorted({b.kind for b in cfg.buffers.values()}))
        if cfg.league is not None:
            goal = "the `league.stop_when` rules"
        elif cfg.eval.stop_value is not None:
            goal = f"{cfg.eval.stop_value:g}"
        else:
            goal = "— (a budget: `stop`)"
        rows.append([code(name), code(cfg.env.id), code(algo), kinds, goal])
    return table(["config (`--config`)", "env", "algorithm", "buffers", "solved at"], rows)


# -- MkDocs events ------------------------------------------------------------------------

_cache: dict[str, str] = {}


def on_files(files: Files, config: Any) -> Files:
    repo = _repo(config)
    for uri in GENERATED:
        if (Path(config.docs_dir) / uri).exists():
            raise PluginError(f"docs/{uri} is generated at build time: delete the file")
    try:
        pages = {
            "reference/config.md": config_reference(),
            "reference/http.md": http_reference(openapi()),
            "reference/cli.md": cli_reference(),
            "results.md": (repo / "bench" / "RESULTS.md").read_text(),
        }
    except PluginError:
        raise
    except Exception as err:  # a build that cannot ask the code must fail, loudly
        raise PluginError(f"generating the reference pages: {type(err).__name__}: {err}") \
            from err
    for uri, content in pages.items():
        files.append(File.generated(config, uri, content=content))
    for png in sorted((repo / "bench" / "figures").glob("*.png")):
        files.append(File.generated(config, f"figures/{png.name}", abs_src_path=str(png)))
    _cache.clear()
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    repo = _repo(config)
    makers = {
        "layers": lambda: layers_table(repo),
        "algorithms": algorithms_table,
        "capabilities": capabilities_text,
        "configs": lambda: configs_table(repo),
    }

    def replace(m: re.Match) -> str:
        name = m.group(1)
        if name not in makers:
            raise PluginError(f"{page.file.src_uri}: unknown marker <!-- rlfleet:{name} -->")
        if name not in _cache:
            _cache[name] = makers[name]()
        return _cache[name]

    return MARKER.sub(replace, markdown)
