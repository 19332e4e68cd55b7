"""The package's layers, read from its imports: every import edge the layering forbids, and
every import cycle, fails here with the modules that make it.

The table of allowed edges is `LAYERS`, the one place it is written down (docs/layers.md
shows it). An import inside a function counts like one at the top of a module: hiding an
edge in a function does not make it go away.
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

SHARED = "rlfleet.shared"
# Each layer and the layers it may import (besides itself and third-party packages). A module
# belongs to the layer with the longest matching prefix.
LAYERS: dict[str, set[str]] = {
    f"{SHARED}.util": set(),
    f"{SHARED}.contract": {f"{SHARED}.util"},
    f"{SHARED}.infra": {f"{SHARED}.contract", f"{SHARED}.util"},
    f"{SHARED}.telemetry": {f"{SHARED}.contract", f"{SHARED}.util"},
    f"{SHARED}.envs": {f"{SHARED}.contract", f"{SHARED}.util"},
    f"{SHARED}.data": {f"{SHARED}.envs", f"{SHARED}.contract", f"{SHARED}.util"},
    f"{SHARED}.algos": {f"{SHARED}.contract", f"{SHARED}.util"},
    f"{SHARED}.run": {f"{SHARED}.algos", f"{SHARED}.data", f"{SHARED}.envs",
                      f"{SHARED}.contract", f"{SHARED}.util"},
    f"{SHARED}.worker": {f"{SHARED}.run", f"{SHARED}.infra", f"{SHARED}.contract",
                         f"{SHARED}.util"},
    # The library the roles share, and the single-process runner with them: the replay and
    # its buffers (the coordinator's), rollouts (the collector's), batching (the learner's),
    # the league (the coordinator's). Each imports the layers above, never another of them.
    f"{SHARED}.replay": {f"{SHARED}.run", f"{SHARED}.data", f"{SHARED}.envs",
                         f"{SHARED}.infra", f"{SHARED}.contract", f"{SHARED}.util"},
    f"{SHARED}.rollout": {f"{SHARED}.run", f"{SHARED}.algos", f"{SHARED}.envs",
                          f"{SHARED}.infra", f"{SHARED}.contract", f"{SHARED}.util"},
    f"{SHARED}.batching": {f"{SHARED}.algos", f"{SHARED}.envs", f"{SHARED}.contract",
                           f"{SHARED}.util"},
    f"{SHARED}.league": {f"{SHARED}.run", f"{SHARED}.infra", f"{SHARED}.contract",
                         f"{SHARED}.util"},
    SHARED: set(),  # the package's own __init__: a docstring
    # The roles: anything in shared, never each other.
    "rlfleet.coordinator": {SHARED},
    "rlfleet.collector": {SHARED},
    "rlfleet.learner": {SHARED},
    "rlfleet.configs": set(),
    # The package itself (services/): how processes start. It may import everything.
    "rlfleet": {"rlfleet"},
}

# Third-party packages a layer must not import: what keeps a status command, a collector or
# the coordinator light.
FORBIDDEN: dict[str, set[str]] = {
    f"{SHARED}.util": {"torch", "gymnasium", "flask", "redis", "requests"},
    f"{SHARED}.contract": {"torch", "gymnasium", "flask", "redis", "requests"},
    f"{SHARED}.infra": {"torch", "gymnasium"},
    f"{SHARED}.telemetry": {"torch", "gymnasium", "flask"},
    f"{SHARED}.envs": {"torch", "flask"},
    f"{SHARED}.replay": {"torch", "flask"},
    f"{SHARED}.league": {"torch", "gymnasium", "flask"},
    "rlfleet.coordinator": {"torch"},
}


def package_dirs() -> dict[str, Path]:
    """Import package -> folder, as pyproject.toml maps them."""
    cfg = tomllib.loads((REPO / "pyproject.toml").read_text())
    return {pkg: REPO / d for pkg, d in cfg["tool"]["setuptools"]["package-dir"].items()}


def modules() -> dict[str, Path]:
    """Every module of the package, by its import name."""
    roots = package_dirs()
    out: dict[str, Path] = {}
    for pkg, folder in roots.items():
        for path in folder.rglob("*.py"):
            rel = path.relative_to(folder).with_suffix("")
            parts = list(rel.parts)
            # a folder mapped to a package of its own is that package's, not this one's
            if any(f"{pkg}.{'.'.join(parts[:i])}" in roots for i in range(1, len(parts))):
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([pkg, *parts])] = path
    return out


def _type_checking_only(tree: ast.AST) -> set[int]:
    """The ids of import nodes under `if TYPE_CHECKING:`: they never run."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) \
                and node.test.id == "TYPE_CHECKING":
            out.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return out


def imports_of(path: Path, known: set[str], runtime_only: bool = False
               ) -> Iterator[tuple[str, int]]:
    """(imported module, line) for every import in the file, inside functions too; `from
    pkg import name` counts as `pkg.name` where that is a module. `runtime_only` leaves out
    the imports under `if TYPE_CHECKING:`."""
    tree = ast.parse(path.read_text(), str(path))
    skip = _type_checking_only(tree) if runtime_only else set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                yield (full if full in known else node.module), node.lineno


def layer_of(module: str) -> str:
    matches = [name for name in LAYERS if module == name or module.startswith(name + ".")]
    assert matches, f"{module} is in no layer: add its package to LAYERS"
    return max(matches, key=len)


def graph() -> dict[str, dict[str, int]]:
    """module -> {imported project module: line}."""
    mods = modules()
    known = set(mods)
    out: dict[str, dict[str, int]] = {}
    for name, path in mods.items():
        edges: dict[str, int] = {}
        for target, line in imports_of(path, known):
            if target == "rlfleet" or target.startswith("rlfleet."):
                while target not in known and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target != name:
                    edges.setdefault(target, line)
        out[name] = edges
    return out


def test_every_module_is_in_a_layer():
    for name in modules():
        layer_of(name)


def test_no_import_crosses_the_layers():
    bad = []
    for name, edges in graph().items():
        src = layer_of(name)
        for target, line in edges.items():
            dst = layer_of(target)
            allowed = LAYERS[src] | {src}
            if not any(dst == a or dst.startswith(a + ".") for a in allowed):
                bad.append(f"{name}:{line} imports {target} ({src} may not import {dst})")
    assert not bad, "imports the layering forbids:\n" + "\n".join(sorted(bad))


def test_no_layer_imports_what_it_must_stay_without():
    mods = modules()
    bad = []
    for name, path in mods.items():
        forbidden = FORBIDDEN.get(layer_of(name), set())
        for target, line in imports_of(path, set(mods), runtime_only=True):
            if target.split(".")[0] in forbidden:
                bad.append(f"{name}:{line} imports {target}")
    assert not bad, "heavy imports in light layers:\n" + "\n".join(sorted(bad))


def cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, it = work[-1]
            for nxt in it:
                if nxt not in edges:
                    continue
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(edges[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        m = stack.pop()
                        on_stack.discard(m)
                        comp.append(m)
                        if m == node:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def test_no_import_cycle():
    edges = graph()
    found = cycles(edges)
    lines = []
    for comp in found:
        members = set(comp)
        lines.append(" <-> ".join(comp))
        for m in comp:
            lines += [f"    {m} imports {t} (line {line})" for t, line in edges[m].items()
                      if t in members]
    assert not found, "import cycles:\n" + "\n".join(lines)


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == [
        ["a", "b", "c"]]
    assert cycles({"a": {"b": 1}, "b": {}}) == []


def _probes(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, source) of each getattr/hasattr whose object mentions a policy or an algo."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in ("getattr", "hasattr") and node.args:
            target = ast.unparse(node.args[0])
            if "policy" in target.lower() or "algo" in target.lower():
                yield node.lineno, ast.unparse(node)


def test_no_role_probes_a_policy_or_an_algorithm_config_by_name():
    """The roles ask what a policy can do with `isinstance` against the capability types
    (shared/algos/capabilities.py), and what an algorithm's settings hold by their settings
    types (shared/contract/algo.py): a probe by attribute name turns a feature off in
    silence when a hook is misspelt."""
    found = []
    for name, path in modules().items():
        if name.split(".")[1:2] in (["coordinator"], ["collector"], ["learner"]):
            found += [f"{name}:{line}: {src}" for line, src in
                      _probes(ast.parse(path.read_text()))]
    assert not found, "probes by attribute name:\n" + "\n".join(found)


def test_the_probe_finder_finds_a_probe():
    tree = ast.parse("x = getattr(policy, 'rng', None)\ny = hasattr(cfg.algo, 'her')\n"
                     "z = getattr(req, mode)\n")
    assert [line for line, _ in _probes(tree)] == [1, 2]


ROLES = ("rlfleet.coordinator", "rlfleet.collector", "rlfleet.learner")


def test_the_single_runner_reaches_the_roles_only_through_their_package_roots():
    """`rlfleet single` runs the roles' own services (`rlfleet.coordinator.create_app`,
    `rlfleet.collector.CollectorService`, `rlfleet.learner.LearnerService`): what the roles
    export, never a module inside them, inside a function too."""
    path = REPO / "services" / "single_process.py"
    found = [f"single_process.py:{line} imports {target}"
             for target, line in imports_of(path, set(modules()))
             if target.startswith(tuple(f"{role}." for role in ROLES))]
    assert not found, "\n".join(found)
    used = {target for target, _ in imports_of(path, set(modules()))}
    assert set(ROLES) <= used  # it does run all three


def test_the_role_finder_finds_a_module_inside_a_role(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("from rlfleet.coordinator import Coordinator\n"
                     "def f():\n    from rlfleet.learner.training import Training\n")
    targets = [t for t, _ in imports_of(probe, set(modules()))]
    assert targets == ["rlfleet.coordinator", "rlfleet.learner.training"]
