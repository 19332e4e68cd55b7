"""Every bench runs, in short mode, and measures every figure it declares: a bench broken by a
change elsewhere (an import moved, a process renamed, a status field dropped) fails here, not
months later in front of whoever wants its figures.

Each bench module in bench/ names the keys of its last JSON line in `FIGURES` and takes
`--short` (`bench.common.parse_args`): the same code with small windows, seeds, repeats and
sizes. A test runs `python -m bench.<name> --short` from the repository root, as a user
would, and reads the very last line of its stdout: it must be JSON, hold no `error`, and hold
every declared figure, none of them null (a per-role or per-count figure: none of its
values). Figures are never compared with values: on a shared two-core machine they say
nothing, and a bench never passes or fails on time. Whatever the bench started must have
exited when it has.

Three benches run elsewhere: `bench.compose` needs a Docker engine and runs in the compose
suite (tests/compose/test_compose_bench.py), `bench.slurm` a Slurm cluster (tests/slurm);
`bench.soak` runs for three minutes in
tests/integration/test_soak.py, which reads its JSON, so a short soak here would only repeat
it.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from bench.common import declared_figures, missing_figures

from .helpers import REPO, marked_env, marked_pids, wait_for

BENCH_DIR = REPO / "bench"
# Modules of bench/ that are not benches, and why.
NOT_BENCHES = {
    "__init__": "the package",
    "common": "what the benches share",
    "compose_stack": "docker compose driven from Python, for bench.compose and tests/compose",
    "slow_env": "the env bench.scaling steps",
    "expert_cartpole": "it writes a dataset (SQIL's demonstrations) and measures nothing",
}
# Benches whose short run is not here, and where it is.
ELSEWHERE = {
    "compose": "needs a Docker engine: tests/compose/test_compose_bench.py runs it",
    "soak": "tests/integration/test_soak.py runs it for three minutes and reads its JSON",
    "slurm": "needs root and Slurm (a cluster in network namespaces): tests/slurm runs it",
}
# What a bench needs beyond the dev install, as the tests of the same features ask for it:
# Python packages (an extra), or programs on PATH.
NEEDS_PACKAGES = {"atari": ("ale_py", "atari"), "selfplay": ("pettingzoo", "games"),
                  "sac": ("mujoco", "mujoco")}
NEEDS_PROGRAMS = {"recovery": "redis-server"}  # it starts one of its own
# A short run takes 2-40 s on a two-core machine; past this it is hung, not slow.
SHORT_TIMEOUT_S = 240.0


def bench_names() -> list[str]:
    """Every module in bench/ that is a bench: found, not listed, so a new one is run too."""
    return sorted(path.stem for path in BENCH_DIR.glob("*.py") if path.stem not in NOT_BENCHES)


def run_short(name: str, tmp_path: Path, env: dict[str, str] | None = None,
              timeout_s: float = SHORT_TIMEOUT_S) -> dict:
    """`python -m bench.<name> --short` from the repository root; its last stdout line, once
    the bench has exited 0 and every process it started has exited too. Its temporary files
    go under `tmp_path` (TMPDIR), where pytest clears them."""
    marker = uuid.uuid4().hex
    run_env = {**marked_env(marker), "TMPDIR": str(tmp_path), **(env or {})}
    bench = subprocess.Popen([sys.executable, "-m", f"bench.{name}", "--short"], cwd=REPO,
                             env=run_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        out, err = bench.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        bench.send_signal(signal.SIGTERM)  # a bench takes its clusters down on SIGTERM
        out, err = bench.communicate(timeout=120)
        pytest.fail(f"bench.{name} --short ran past {timeout_s:g} s:\n{err[-3000:]}")
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
    (tmp_path / f"{name}.out").write_text(out)  # the tables, for a failure's reader
    (tmp_path / f"{name}.err").write_text(err)
    assert bench.returncode == 0, f"bench.{name} exited {bench.returncode}:\n{err[-3000:]}"
    wait_for(lambda: not marked_pids(marker), 30, f"every process of bench.{name} to exit")
    lines = out.strip().splitlines()
    assert lines, f"bench.{name} printed nothing:\n{err[-3000:]}"
    try:
        result = json.loads(lines[-1])
    except json.JSONDecodeError:
        pytest.fail(f"bench.{name}'s last line is not JSON: {lines[-1][:500]!r}\n"
                    f"{err[-3000:]}")
    assert isinstance(result, dict), lines[-1][:500]
    return result


def check_figures(name: str, result: dict) -> None:
    """No error, and every figure bench.<name> declares is there and not null."""
    assert "error" not in result, f"bench.{name}: {result['error']}"
    figures = declared_figures(BENCH_DIR / f"{name}.py")
    assert figures, f"bench.{name} declares no FIGURES"
    missing = missing_figures(result, figures)
    assert not missing, f"bench.{name} left these figures out or null: {missing}\n{result}"


def test_every_bench_declares_its_figures():
    """A new bench cannot skip the short run unnoticed: it is a bench unless named above."""
    names = bench_names()
    assert set(ELSEWHERE) <= set(names), "a bench run elsewhere is gone: update ELSEWHERE"
    undeclared = [n for n in names if not declared_figures(BENCH_DIR / f"{n}.py")]
    assert not undeclared, f"benches without FIGURES (or list them in NOT_BENCHES): {undeclared}"


@pytest.mark.parametrize("name", [n for n in bench_names() if n not in ELSEWHERE])
@pytest.mark.timeout(SHORT_TIMEOUT_S + 120)
def test_the_bench_measures_every_figure_in_short_mode(name, tmp_path):
    package, extra = NEEDS_PACKAGES.get(name, (None, None))
    if package is not None and importlib.util.find_spec(package) is None:
        pytest.skip(f"bench.{name} needs the {extra} extra: pip install -e '.[{extra}]'")
    if name in NEEDS_PROGRAMS and shutil.which(NEEDS_PROGRAMS[name]) is None:
        pytest.skip(f"bench.{name} needs {NEEDS_PROGRAMS[name]} on PATH")
    check_figures(name, run_short(name, tmp_path))


def test_the_expert_dataset_script_still_writes_one(tmp_path):
    """Not a bench, but a module in bench/ a config names: it still writes its dataset."""
    done = subprocess.run([sys.executable, "-m", "bench.expert_cartpole", "--out",
                           str(tmp_path / "datasets"), "--episodes", "2"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["episodes"] == 2 and Path(result["path"]).is_dir(), result
