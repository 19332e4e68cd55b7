"""Evaluation videos and the episode table, from a real CartPole run through `rlfleet up`:
MP4 files in the run dir that imageio reads, the GIF entry in TensorBoard, the links in
summary.json, and one row per finished episode that adds up to the coordinator's count."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import requests
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from rlfleet.shared.contract.wire.base import API
from rlfleet.shared.telemetry.rundata import load_run
from rlfleet.shared.telemetry.video import read_frames

from .helpers import coordinator_url, small_config, wait_for

# Only a safety net: the test stops the run once three evaluations are in. A small budget of
# env steps would race the evaluations: one collector may spend seconds on the first (with
# its video) while the other collects the whole budget.
MAX_ENV_STEPS = 400_000


def _evaluations(url: str) -> int:
    resp = requests.get(f"{url}{API}/evaluations", timeout=5)
    resp.raise_for_status()
    return resp.json()["total"]


def test_a_run_records_evaluation_videos_and_every_episode(launch, tmp_path: Path):
    config = small_config(tmp_path / "small.yaml",
                          env={"num_envs": 4},
                          eval={"every_env_steps": 1000, "episodes": 4, "num_envs": 4,
                                "video": {"every_evaluations": 2, "fps": 25, "episodes": 3,
                                          "max_frames": 200}})
    run_dir = tmp_path / "run"
    up = launch("--config", str(config), "--collectors", "2", "--run-dir", str(run_dir),
                "--quiet", "--max-env-steps", str(MAX_ENV_STEPS))
    url = wait_for(lambda: coordinator_url(up), 60, "the coordinator's URL")
    wait_for(lambda: _evaluations(url) >= 3, 150, "three evaluations")
    requests.post(f"{url}{API}/run/stop", timeout=5).raise_for_status()
    code = up.wait(timeout=60)
    assert code in (0, 3), f"exit code {code}:\n{up.stderr[-3000:]}"
    summary = json.loads((run_dir / "summary.json").read_text())
    evaluations = json.loads((run_dir / "evaluations.json").read_text())
    assert len(evaluations) >= 2

    # every other evaluation has a video (the first one included), linked from its result
    filmed = [e for e in evaluations if e["video"]]
    assert [e["seq"] for e in filmed] == [e["seq"] for e in evaluations if e["seq"] % 2 == 1]
    # (an evaluation reported as the run stopped may be in summary.json's list only)
    assert {e["video"] for e in filmed} <= set(summary["videos"])
    for video in summary["videos"]:
        frames = read_frames(run_dir / video)
        assert frames.ndim == 4 and frames.shape[-1] == 3
        assert 10 < len(frames) <= 200  # 3 episodes (even failing ones) capped by max_frames
        assert frames.std() > 0  # a picture, not a blank
    # ... and in TensorBoard, as an animated GIF at the evaluation's env step
    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"images": 0}).Reload()
    images = acc.Images("eval/video")
    assert {e["env_steps"] for e in filmed} <= {i.step for i in images}
    assert len(images) == len(summary["videos"])
    assert all(i.encoded_image_string[:6] == b"GIF89a" for i in images)
    # the weights and video blobs of finished evaluations are gone from storage
    assert not [p for p in (run_dir / "storage").rglob("*") if p.name.startswith("video-")]

    # the episode table: one row per training episode, as the coordinator counted them
    table = load_run(run_dir).episodes
    training = table[~table["evaluation"]]
    assert len(training) == summary["episodes"] > 0
    assert set(training["worker_id"]) == {"collector-1", "collector-2"}
    assert set(training["env_index"]) <= {0, 1, 2, 3}
    assert (training["seed"] >= 0).all() and training["task_id"].str.startswith("collect").all()
    assert (training["length"] >= 1).all() and np.isfinite(training["return"]).all()
    assert (training["env_step"] <= summary["env_steps"]).all()
    assert (training["policy_version"] >= -1).all()
    # CartPole pays 1 per step: every return is its length
    assert (training["return"] == training["length"]).all()
    # evaluation episodes are marked, deterministic and stochastic, for every evaluation
    # (one reported as the run stopped may be in the table but not in evaluations.json)
    evals = table[table["evaluation"]]
    for e in evaluations:
        rows = evals[evals["task_id"] == e["task_id"]]
        assert rows["deterministic"].sum() == e["episodes"]
        assert (~rows["deterministic"].astype(bool)).sum() == e["stochastic"]["episodes"]
        greedy = rows[rows["deterministic"].astype(bool)]
        assert abs(greedy["return"].mean() - e["return_mean"]) < 1e-6
    up.assert_no_orphans()
