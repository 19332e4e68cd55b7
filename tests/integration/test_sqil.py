"""SQIL through the cluster: 20 episodes of a scripted CartPole controller as a dataset
buffer, mixed 50/50 with the agent's own transitions, rewards set per buffer (expert 1,
agent 0) by `learner.mix`; the run reaches an evaluation return of at least 450."""

from __future__ import annotations

import json

import pytest
import yaml

pytest.importorskip("minari", reason="the datasets extra: pip install -e '.[datasets]'")

from bench.expert_cartpole import write_expert_dataset  # noqa: E402

from .helpers import REPO  # noqa: E402


def test_sqil_learns_cartpole_from_20_expert_episodes(launch, tmp_path):
    path, returns = write_expert_dataset(tmp_path / "datasets", episodes=20)
    assert len(returns) == 20 and min(returns) == 500  # the scripted expert never fails

    data = yaml.safe_load((REPO / "configs" / "cartpole-sqil.yaml").read_text())
    data["buffers"]["expert"]["path"] = str(path)
    assert [(m["buffer"], m["fraction"], m["reward"]) for m in data["learner"]["mix"]] == [
        ("replay", 0.5, 0.0), ("expert", 0.5, 1.0)]
    data["stop"] = {"max_env_steps": 40_000, "max_wall_s": 240}
    config = tmp_path / "sqil.yaml"
    config.write_text(yaml.safe_dump(data, sort_keys=False))

    run = tmp_path / "sqil"
    up = launch("--config", str(config), "--collectors", "1", "--run-dir", str(run), "--quiet")
    assert up.wait(timeout=300) == 0, up.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["solved"] and summary["eval_return"] >= 450, summary
