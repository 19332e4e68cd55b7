"""The documentation: the site builds with `--strict` (every link and anchor resolves), its
generated references say everything the code has (every config field of every section,
algorithm and reward model; every path of the OpenAPI document), every repository path a
page names exists, and the README stays a ten-minute read that starts with the two commands.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

pytest.importorskip("mkdocs", reason="the docs extra: pip install -e '.[docs]'")
pytest.importorskip("material", reason="the docs extra: pip install -e '.[docs]'")

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
GENERATED = ("reference/config.md", "reference/http.md", "reference/cli.md", "results.md")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(REPO / "mkdocs.yml"),
         "-d", str(out)], capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}"
    return out


def _page(site: Path, uri: str) -> str:
    return (site / uri.removesuffix(".md") / "index.html").read_text()


def _sections(page: str) -> dict[str, str]:
    """Heading id -> the HTML up to the next heading of level 2 or 3."""
    marks = [(m.start(), m.group(1)) for m in re.finditer(r'<h[23] id="([^"]+)"', page)]
    return {anchor: page[start:end] for (start, anchor), (end, _) in
            zip(marks, [*marks[1:], (len(page), "")], strict=True)}


# -- the configuration reference ----------------------------------------------------------

def _submodels(tp: typing.Any) -> list[type[BaseModel]]:
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [tp]
    return [m for arg in typing.get_args(tp) for m in _submodels(arg)]


def _reachable(model: type[BaseModel], seen: dict[str, type[BaseModel]]) -> None:
    name = f"{model.__module__}.{model.__qualname__}"
    if name in seen:
        return
    seen[name] = model
    for field in model.model_fields.values():
        for sub in _submodels(field.annotation):
            _reachable(sub, seen)


def test_the_config_reference_lists_every_field_of_every_section_and_algorithm(site):
    from rlfleet.shared.algos.registry import ALGORITHMS, REWARD_MODELS
    from rlfleet.shared.run.config import RunConfig

    expected: dict[str, type[BaseModel]] = {}
    _reachable(RunConfig, expected)  # the sections, and through `algo` every algorithm
    for spec in [*ALGORITHMS.values(), *REWARD_MODELS.values()]:
        _reachable(spec.config, expected)

    listed: dict[str, set[str]] = {}
    model_of: dict[str, str] = {}
    for anchor, html in _sections(_page(site, "reference/config.md")).items():
        model = re.search(r"Model: <code>([\w.]+)</code>", html)
        if model is None:
            continue
        model_of[anchor] = model.group(1)
        fields = re.findall(r"<tr>\s*<td><code>(\w+)</code></td>", html)
        listed.setdefault(model.group(1), set()).update(fields)

    assert set(expected) <= set(listed), f"sections missing: {sorted(set(expected) - set(listed))}"
    for name, model in expected.items():
        assert listed[name] == set(model.model_fields), name
    for name, spec in ALGORITHMS.items():
        assert model_of.get(f"algo-{name}") == \
            f"{spec.config.__module__}.{spec.config.__qualname__}", name
    for name, spec in REWARD_MODELS.items():
        assert model_of.get(f"reward-model-{name}") == \
            f"{spec.config.__module__}.{spec.config.__qualname__}", name


# -- the HTTP reference -------------------------------------------------------------------

@pytest.fixture(scope="module")
def openapi(tmp_path_factory: pytest.TempPathFactory) -> dict:
    from rlfleet.coordinator.app import create_app
    from rlfleet.coordinator.openapi import openapi_document
    from rlfleet.shared.infra.auth import TOKEN_ENV, TOKEN_FILE_ENV
    from rlfleet.shared.run.config import load_config

    tmp = tmp_path_factory.mktemp("openapi")
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv(TOKEN_ENV, raising=False)
        mp.delenv(TOKEN_FILE_ENV, raising=False)
        app = create_app(load_config("cartpole-dqn"), str(tmp / "storage"), tmp / "run",
                         start=False)
    try:
        return openapi_document(app)
    finally:
        app.extensions["rlfleet"].close()


def test_the_http_reference_lists_every_path_and_schema(site, openapi):
    page = _page(site, "reference/http.md")
    anchors = set(_sections(page))
    assert openapi["paths"], "an empty OpenAPI document?"
    for path, methods in openapi["paths"].items():
        for method in methods:
            assert f"<code>{method.upper()} {path}</code>" in page, (method, path)
    for name in openapi["components"]["schemas"]:
        assert f"schema-{name.lower()}" in anchors, name


def test_the_command_line_reference_lists_every_command(site):
    from rlfleet.cli import build_parser

    page = _page(site, "reference/cli.md")
    commands = next(a for a in build_parser()._actions if a.choices and a.dest == "command")
    for name in commands.choices:
        assert f"<code>rlfleet {name}</code>" in page, name


def test_generated_pages_are_never_committed():
    for uri in GENERATED:
        assert not (REPO / "docs" / uri).exists(), f"docs/{uri} is generated at build time"


# -- paths and the README -----------------------------------------------------------------

# A repository path as pages write it; one followed by a placeholder (`<name>`) is a pattern.
_PATH = re.compile(r"(?<![\w/.-])((?:shared|coordinator|collector|learner|services|configs|"
                   r"bench|tests|deploy|docs|\.ci)/[\w./-]*\w)(?![\w/]*[<{*])")


def test_every_repository_path_a_page_names_exists():
    """bench/RESULTS.md is left out: it is history, naming files as they were then."""
    pages = [README, *sorted((REPO / "docs").rglob("*.md"))]
    missing = [(page.relative_to(REPO).as_posix(), path) for page in pages
               for path in _PATH.findall(page.read_text())
               if not (REPO / path).exists()]
    assert missing == [], f"pages name paths that do not exist: {missing}"


def test_the_readme_is_short_and_starts_with_the_two_commands():
    lines = README.read_text().splitlines()
    assert len(lines) < 250, f"README.md has {len(lines)} lines: the reference goes in docs/"
    body = [line for line in lines[1:] if line.strip()]
    assert lines[0].startswith("# ") and body[0].startswith("```"), \
        "README.md starts with its title, then the two commands"
    block = body[1:body.index("```", 1)]
    assert [line.split("#")[0].strip() for line in block] == ["make up", "make test"], block


def test_the_readme_has_no_dated_figures_and_its_links_resolve():
    text = README.read_text()
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text), "dated figures go to bench/RESULTS.md"
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if "://" not in target:
            assert (REPO / target).exists(), f"README.md links to {target}, which is missing"


def test_the_readme_names_every_ready_config():
    from rlfleet.shared.run.config import packaged_configs

    text = README.read_text()
    assert [n for n in packaged_configs() if f"`{n}`" not in text] == []
