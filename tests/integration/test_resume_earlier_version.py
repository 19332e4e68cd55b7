"""A run directory made by the previous version of rlfleet, before it was one package
(`data/cartpole-rnd-old-run.tar.gz`, made with `python -m services.cli up --config
data/cartpole-rnd-old-run.yaml --collectors 1` at the commit before the package move): its
saved config names the reward model by its old import path and holds `learner.by_buffer:
null`, its checkpoints and snapshots are the old layout's. `rlfleet resume` continues it:
the old path resolves with a warning naming the new one, the learner resumes from the
run's last checkpoint (reward model included), and the counters go on from where it
stopped."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import yaml

DATA = Path(__file__).resolve().parent / "data"


def test_a_run_made_by_the_previous_version_resumes(tmp_path):
    with tarfile.open(DATA / "cartpole-rnd-old-run.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    run_dir = tmp_path / "cartpole-rnd-old"
    # the directory moved here from where it was made: its config names its storage there
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert config["algo"]["reward_model"]["path"] == "shared.algos.rnd:RND"
    assert config["learner"]["by_buffer"] is None
    config["storage"] = str(run_dir / "storage")
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    before = json.loads((run_dir / "summary.json").read_text())
    index = json.loads((run_dir / "storage" / "blobs" / "ckpt-index").read_text())
    last_checkpoint = index["checkpoints"][-1]["train_iterations"]

    resumed = subprocess.run(
        [sys.executable, "-m", "rlfleet", "resume", str(run_dir), "--quiet",
         "--max-env-steps", str(before["env_steps"] + 1500)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    # 0: solved on the way; 3: the budget ran out first (both are a run that went on)
    assert resumed.returncode in (0, 3), resumed.stderr[-3000:]
    assert "'shared.algos.rnd:RND' is an old import path: write " \
           "'rlfleet.shared.algos.rnd:RND'" in resumed.stderr

    after = json.loads((run_dir / "summary.json").read_text())
    assert after["outcome"] == ("solved" if resumed.returncode == 0 else "stopped")
    assert after["env_steps"] > before["env_steps"]
    log = (run_dir / "logs" / "coordinator.log").read_text()
    restored = int(re.search(r"restored run at (\d+) env steps", log).group(1))
    assert restored == before["env_steps"]
    learner_log = (run_dir / "logs" / "learner.log").read_text()
    assert f"resumed from checkpoint at train iteration {last_checkpoint}" in learner_log
    assert after["train_iterations"] > before["train_iterations"]
    assert after["policy_version"] > before["policy_version"]
