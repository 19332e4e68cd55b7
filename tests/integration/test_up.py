"""`rlfleet up` end to end: a whole local cluster (coordinator, learner, two collectors) run as
a subprocess, as a user runs it, on directory storage.

Every `rlfleet up` here carries a unique marker in its environment, inherited by every process
it starts, so each test can prove that nothing it started is left running afterwards.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from .helpers import (
    small_config,
)

MAX_ENV_STEPS = 15_000


def test_up_runs_a_cluster_to_its_budget(launch, tmp_path: Path):
    # A version due every update, but at most one each 0.25 s: the interval, not
    # publish_every, sets how many versions the learner pays for.
    config = small_config(tmp_path / "small.yaml",
                          learner={"publish_every": 1, "publish_min_interval_s": 0.25})
    run_dir = tmp_path / "run"
    up = launch("--config", str(config), "--collectors", "2", "--run-dir", str(run_dir),
                "--quiet", "--max-env-steps", str(MAX_ENV_STEPS))
    code = up.wait(timeout=150)
    assert code in (0, 3), f"exit code {code}:\n{up.stderr[-3000:]}"

    summary = json.loads((run_dir / "summary.json").read_text())
    for key in ("solved", "eval_return", "env_steps", "train_iterations", "policy_version",
                "wall_seconds"):
        assert key in summary, f"summary.json lacks {key}: {summary}"
    assert summary["solved"] is (code == 0)
    assert summary["outcome"] == ("solved" if code == 0 else "stopped")
    assert summary["error"] is None
    assert summary["env_steps"] >= MAX_ENV_STEPS
    assert summary["train_iterations"] > 0
    assert summary["policy_version"] > 0
    # Versions: the first, one per 0.25 s, and those published as the run ends.
    assert summary["policy_version"] <= summary["wall_seconds"] / 0.25 + 3
    assert summary["train_iterations"] > 2 * summary["policy_version"]
    assert summary["eval_return"] is not None and 1 <= summary["eval_return"] <= 500
    assert 0 < summary["wall_seconds"] < 150
    assert summary["collectors"] == 2
    if code == 3:
        assert summary["stop_reason"] == f"max_env_steps={MAX_ENV_STEPS} reached"

    # The resolved config holds the CLI's budget; the run dir holds the storage and the logs.
    resolved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert resolved["stop"]["max_env_steps"] == MAX_ENV_STEPS
    assert resolved["name"] == run_dir.name
    assert (run_dir / "storage").is_dir()
    logs = {p.name for p in (run_dir / "logs").iterdir()}
    assert {"coordinator.log", "learner.log", "collector-1.log", "collector-2.log"} <= logs
    for name in ("collector-1.log", "collector-2.log", "learner.log"):
        assert "registered as" in (run_dir / "logs" / name).read_text(), name
    assert "summary" in up.stderr
    up.assert_no_orphans()


@pytest.mark.parametrize("section, change, field", [
    ("algo", {"batch_sise": 64}, "algo.batch_sise"),
    ("eval", {"episodes": 0}, "eval.episodes"),
])
def test_up_rejects_a_bad_config_naming_the_field(launch, tmp_path: Path, section, change,
                                                   field):
    config = small_config(tmp_path / "bad.yaml", **{section: change})
    run_dir = tmp_path / "run"
    up = launch("--config", str(config), "--run-dir", str(run_dir), "--quiet")
    code = up.wait(timeout=60)
    assert code == 2, f"exit code {code}:\n{up.stderr}"
    assert field in up.stderr
    assert str(config) in up.stderr
    assert "Traceback" not in up.stderr
    assert not (run_dir / "logs").exists(), "no cluster was started"
    up.assert_no_orphans()
