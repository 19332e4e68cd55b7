"""The shape the codebase keeps: learner functions a screen long at most, coordinator
classes that stay assemblies of parts, a contract split by section. A change that grows one
past its bound fails here, naming it, instead of a reader finding out."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _nodes(folder: str, kind: type) -> list[tuple[str, int]]:
    """(`path:line name`, length in lines) of every node of `kind` under `folder`."""
    out = []
    for path in sorted((REPO / folder).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, kind):
                where = f"{path.relative_to(REPO)}:{node.lineno} {node.name}"
                out.append((where, node.end_lineno - node.lineno + 1))
    return out


def test_every_function_of_the_learner_is_at_most_80_lines():
    long = [f"{where}: {n} lines" for where, n in
            _nodes("learner", (ast.FunctionDef, ast.AsyncFunctionDef)) if n > 80]
    assert not long, "\n".join(long)


def test_no_class_of_the_coordinator_is_over_300_lines():
    classes = _nodes("coordinator", ast.ClassDef)
    long = [f"{where}: {n} lines" for where, n in classes if n > 300]
    assert not long, "\n".join(long)
    assert any(where.endswith(" Coordinator") for where, _ in classes)


def test_the_wire_contract_is_split_by_section():
    schemas = REPO / "shared" / "contract" / "schemas.py"
    assert not schemas.exists() or len(schemas.read_text().splitlines()) < 300
    assert all(len(p.read_text().splitlines()) < 300
               for p in (REPO / "shared" / "contract" / "wire").glob("*.py"))


def test_the_training_loops_live_in_the_learner():
    loops = REPO / "learner" / "loops"
    assert {p.stem for p in loops.glob("*.py")} >= {"base", "off_policy", "on_policy"}


LOOP_BODIES = ("run_generation", "learn_all", "update")


def test_no_built_in_feature_is_guarded_inside_the_loops():
    """The loops learn and keep time; what the config turns on (histograms, the batch log,
    dataset scores, ...) is a hook the loop's stages call, chosen once in `built_ins`, never
    an `if cfg...` or an `if x is not None` inside a loop's body."""
    found = []
    for path in sorted((REPO / "learner" / "loops").glob("*.py")):
        for fn in ast.walk(ast.parse(path.read_text())):
            if not isinstance(fn, ast.FunctionDef) or fn.name not in LOOP_BODIES:
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.If | ast.IfExp):
                    test = ast.unparse(node.test)
                    if "cfg" in test or "is not None" in test or "hooks" in test:
                        found.append(f"{path.name}:{node.lineno} {fn.name}: if {test}")
    assert not found, "\n".join(found)
