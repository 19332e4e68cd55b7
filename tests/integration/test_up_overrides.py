"""`rlfleet up` and `rlfleet resume` with `KEY=VALUE` overrides, as a user runs them: the run
directory's `config.yaml` (what every child reads) holds them, the launcher shows them at
start, and a resume changes what a resume may change."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

from rlfleet.shared.run.config import load_config

from .helpers import BASE_CONFIG, REPO, Up, marked_env

OVERRIDES = ("algo.lr=3e-4", "env.num_envs=2", "eval.every_env_steps=1000", "eval.episodes=2",
             "eval.num_envs=2", "buffers.replay.rate_limit.min_size=200",
             "learner.mix=[{buffer: replay, fraction: 1.0}]")


class Resume(Up):
    """One `python -m rlfleet resume ...` subprocess, watched as `Up` watches `up`."""

    def __init__(self, *args: str) -> None:
        self.marker = uuid.uuid4().hex
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rlfleet", "resume", *args], cwd=REPO,
            env=marked_env(self.marker), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)
        self.stdout = self.stderr = ""


def run_up(*args: str, timeout: float = 240, command: type[Up] = Up) -> Up:
    up = command(*args)
    try:
        code = up.wait(timeout=timeout)
    finally:
        up.kill_leftovers()
    assert code in (0, 3), f"exit code {code}:\n{up.stderr[-3000:]}"  # solved, or stopped
    return up


def test_up_runs_the_overridden_config_and_resume_changes_it(tmp_path: Path):
    run_dir = tmp_path / "run"
    up = run_up("--config", str(BASE_CONFIG), "--collectors", "1", "--run-dir", str(run_dir),
                "--max-env-steps", "2000", "--quiet", *OVERRIDES)
    assert f"overrides: {' '.join(OVERRIDES)}" in up.stderr, up.stderr[-3000:]
    cfg = load_config(run_dir / "config.yaml")
    assert cfg.algo.lr == 3e-4 and cfg.env.num_envs == 2
    assert (cfg.eval.every_env_steps, cfg.eval.episodes, cfg.eval.num_envs) == (1000, 2, 2)
    assert cfg.buffers["replay"].rate_limit.min_size == 200
    assert cfg.algo.gamma == load_config(BASE_CONFIG).algo.gamma  # the file's, untouched
    assert (run_dir / "summary.json").is_file()

    resumed = run_up(str(run_dir), "--max-env-steps", "3000", "--quiet", "algo.lr=1e-4",
                     "--continue", command=Resume)
    assert "overrides: algo.lr=1e-4" in resumed.stderr, resumed.stderr[-3000:]
    cfg = load_config(run_dir / "config.yaml")
    assert cfg.algo.lr == 1e-4 and cfg.env.num_envs == 2 and cfg.stop.max_env_steps == 3000
