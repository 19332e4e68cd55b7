"""SAC end to end: `rlfleet up` with `configs/pendulum-sac.yaml` reaches an evaluation of -200
on Pendulum-v1, from one update per env step (the rate limiter's replay ratio), its
temperature tuned along the way, its first env steps acted uniformly at random, its
observations normalised by statistics the off-policy learner merges from the chunks it reads
(`algo.obs_norm`) and publishes with the actor."""

from __future__ import annotations

import json

from safetensors.torch import load_file

from rlfleet.shared.telemetry.rundata import load_run

from .helpers import config_from


def test_sac_reaches_minus_200_on_pendulum(launch, tmp_path):
    config = config_from(tmp_path, "pendulum-sac.yaml", algo={"obs_norm": True},
                         stop={"max_env_steps": 40_000, "max_wall_s": 300})
    run_dir = tmp_path / "run"
    up = launch("--config", str(config), "--collectors", "2", "--run-dir", str(run_dir),
                "--quiet")
    code = up.wait(timeout=360)
    assert code == 0, f"exit code {code}:\n{up.stderr[-3000:]}"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["solved"] is True and summary["eval_return"] >= -200, summary
    # about one update per env step past the buffer's min_size: the replay ratio held
    assert summary["train_iterations"] > 0.5 * (summary["env_steps"] - 1000), summary

    run = load_run(run_dir)
    _, alpha, _ = run.series("train/alpha")
    assert alpha[-1] < 1.0  # tuned down from init_alpha as the policy's entropy fell
    for key in ("train/critic_loss", "train/actor_loss", "train/entropy"):
        assert key in run, key
    # the kept actor carries observation statistics counted from the collectors' chunks
    state = load_file(run_dir / "best_policy.safetensors")
    count = float(state["obs_norm.count"])
    assert 1000 <= count <= summary["env_steps"], (count, summary["env_steps"])
    up.assert_no_orphans()
