"""APPO end to end through `rlfleet up`: V-trace targets solve CartPole and Acrobot from
every chunk the collectors send, none dropped for its age."""

from __future__ import annotations

import json

import pytest

from .helpers import config_from


@pytest.mark.parametrize("config,stop_value", [("cartpole-appo.yaml", 475),
                                               ("acrobot-appo.yaml", -100)])
def test_appo_solves_through_the_cluster_from_every_chunk(launch, tmp_path, config,
                                                          stop_value):
    path = config_from(tmp_path, config, stop={"max_wall_s": 240})
    run_dir = tmp_path / "run"
    up = launch("--config", str(path), "--collectors", "2", "--run-dir", str(run_dir),
                "--quiet")
    code = up.wait(timeout=300)
    assert code == 0, f"exit code {code}:\n{up.stderr[-3000:]}"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["solved"] is True and summary["algo"] == "appo"
    assert summary["eval_return"] >= stop_value
    train = summary["train"]
    assert train["dropped_stale_chunks"] == 0 and train["dropped_stale_rows"] == 0
    assert 0 < train["importance_weight_mean"] <= 1.0  # min(rho_bar = 1, pi / mu)
    assert 0 <= train["importance_weight_truncated"] <= 1.0
    assert train["policy_lag_mean"] >= 0
    up.assert_no_orphans()
