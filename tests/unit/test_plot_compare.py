"""`rlfleet plot RUN RUN ... --out PNG`: several runs' returns on shared axes, from runs the
real logger wrote into tmp_path."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rlfleet.plot import plot_runs

from .test_plot import assert_png, synthetic_run

REPO = Path(__file__).resolve().parents[2]


def _run(tmp_path: Path, name: str, seed: int, evals: bool = True) -> Path:
    run_dir = tmp_path / f"{name}-s{seed}"
    synthetic_run(run_dir, evals=evals)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(
        {"name": f"{name}-s{seed}", "seed": seed, "eval": {"stop_value": 475},
         "algo": {"name": "dqn", "plain": name == "plain"}}))
    return run_dir


def test_runs_of_two_configs_are_drawn_on_shared_axes(tmp_path):
    dirs = [_run(tmp_path, name, seed) for name in ("plain", "bonus") for seed in (0, 1)]
    out = tmp_path / "compare.png"
    result = plot_runs(dirs, out)
    assert_png(out)
    assert result.series == ["plain-s0", "plain-s1", "bonus-s0", "bonus-s1"]


def test_the_cli_compares_several_runs_and_asks_for_an_out_path(tmp_path):
    dirs = [str(_run(tmp_path, "plain", 0)), str(_run(tmp_path, "bonus", 0, evals=False))]
    out = tmp_path / "cli.png"
    done = subprocess.run([sys.executable, "-m", "rlfleet", "plot", *dirs, "--out",
                           str(out)], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "plain-s0, bonus-s0" in done.stdout
    assert_png(out)
    missing = subprocess.run([sys.executable, "-m", "rlfleet", "plot", *dirs],
                             capture_output=True, text=True, cwd=REPO, timeout=120)
    assert missing.returncode == 2 and "--out" in missing.stderr


def test_runs_with_nothing_to_compare_are_an_error(tmp_path):
    empty = [tmp_path / "a", tmp_path / "b"]
    for d in empty:
        d.mkdir()
        (d / "metrics.jsonl").write_text("")
    with pytest.raises(ValueError, match="nothing to plot"):
        plot_runs(empty, tmp_path / "x.png")


def test_one_configs_seeds_share_a_colour_and_another_config_does_not(tmp_path):
    from rlfleet.plot import _config_group

    plain0, plain1, bonus0 = (_run(tmp_path, "plain", 0), _run(tmp_path, "plain", 1),
                              _run(tmp_path, "bonus", 0))
    assert _config_group(plain0) == _config_group(plain1) != _config_group(bonus0)
