"""`rlfleet export RUN --out DIR` with its default source, right after an on-policy run: PPO's
queue buffer keeps no whole episodes and the run saves none, so the dataset is rolled out
from the run's best policy, and the output says so."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest
import requests

from rlfleet.shared.contract.wire.base import API

from .helpers import REPO, config_from, coordinator_url, wait_for

pytest.importorskip("minari", reason="the datasets extra: pip install -e '.[datasets]'")


def _evaluations(url: str) -> int:
    resp = requests.get(f"{url}{API}/evaluations", timeout=5)
    resp.raise_for_status()
    return resp.json()["total"]


def test_export_right_after_a_ppo_run_rolls_out_the_best_policy(launch, tmp_path):
    import minari

    # 8 envs and chunks of 64 transitions: 8 steps of each env per chunk, while a CartPole
    # episode lasts 8 steps at least, so no episode lies wholly inside one chunk and the
    # buffer snapshot holds none whatever the timing (the default's 32 steps make that
    # merely likely).
    config = config_from(tmp_path, "cartpole-ppo.yaml", collector={"chunk_size": 64},
                         eval={"every_env_steps": 2000, "episodes": 2, "num_envs": 2,
                               "stochastic": False, "stop_value": None},
                         stop={"max_env_steps": 400_000, "max_wall_s": 120})
    run = tmp_path / "run"
    up = launch("--config", str(config), "--collectors", "1", "--run-dir", str(run),
                "--quiet")
    url = wait_for(lambda: coordinator_url(up), 60, "the coordinator's URL")
    wait_for(lambda: _evaluations(url) >= 1, 120, "an evaluation")
    requests.post(f"{url}{API}/run/stop", timeout=5).raise_for_status()
    code = up.wait(timeout=60)
    assert code in (0, 3), f"exit code {code}:\n{up.stderr[-3000:]}"
    assert (run / "best_policy.safetensors").is_file()

    root = tmp_path / "datasets"
    done = subprocess.run([sys.executable, "-m", "rlfleet", "export", str(run), "--out",
                           str(root), "--episodes", "3", "--dataset-id", "rlfleet/ppo-v0"],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    out = done.stdout
    assert out.startswith("exported 3 episodes") and "rolled out from the best policy" in out
    assert "passed over saved: " in out and "passed over snapshot: " in out, out

    os.environ["MINARI_DATASETS_PATH"] = str(root)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dataset = minari.load_dataset("rlfleet/ppo-v0")
        assert dataset.total_episodes == 3 and dataset.spec.env_spec.id == "CartPole-v1"
        for ep in dataset.iterate_episodes():
            assert ep.terminations[-1] or ep.truncations[-1]
            assert len(ep.observations) == len(ep.actions) + 1
    finally:
        os.environ.pop("MINARI_DATASETS_PATH", None)
    up.assert_no_orphans()
