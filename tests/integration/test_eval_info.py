"""What an env says in its info reaches the evaluation, through `rlfleet up`: `eval.info_keys`
(means of info values in the evaluation report and the run's metrics), `eval.episode_return_key`
(the env's own score as the episode's return) and `eval.video.render_kwargs` (the video's env
made with them: here its frame size).

`my_rl:ScoredByIndex` pays 1 a step, and its last step's info says `distance` (the episode's
length) and `episode.r`, 100 a step, as gymnasium's RecordEpisodeStatistics would under
clipped rewards."""

from __future__ import annotations

import json

import pytest

from rlfleet.shared.telemetry.rundata import load_run

from .helpers import REPO, small_config
from .test_episodes_videos import read_frames

USERLAND = REPO / "tests" / "userland"


def test_info_values_the_env_reported_return_and_render_kwargs(launch, tmp_path):
    pytest.importorskip("imageio", reason="the video extra is not installed (make test does)")
    config = small_config(
        tmp_path / "scored.yaml",
        env={"id": "my_rl:ScoredByIndex", "num_envs": 2},
        eval={"every_env_steps": 500, "episodes": 4, "num_envs": 2,
              "info_keys": ["distance", "not_reported"], "episode_return_key": "episode.r",
              "video": {"every_evaluations": 1, "episodes": 1, "max_frames": 50,
                        "render_kwargs": {"frame_size": 48}}},
        stop={"max_env_steps": 1600, "max_wall_s": 90})
    run_dir = tmp_path / "run"
    up = launch("--config", str(config), "--collectors", "1", "--run-dir", str(run_dir),
                "--quiet", env={"PYTHONPATH": str(USERLAND)})
    code = up.wait(timeout=150)
    assert code == 3, f"exit code {code}:\n{up.stderr[-3000:]}"  # its budget ran out
    evaluations = json.loads((run_dir / "evaluations.json").read_text())
    assert evaluations
    for e in evaluations:
        for mode in ("deterministic", "stochastic"):
            s = e[mode]
            # the env's score, not the sum of rewards; the info's mean; a key never reported
            # is left out rather than reported as 0
            assert s["return_mean"] == pytest.approx(100 * s["length_mean"])
            assert s["info"] == {"distance": pytest.approx(s["length_mean"])}
    run = load_run(run_dir)
    steps, distance, _ = run.series("eval/deterministic/info/distance")
    # (an evaluation reported as the run stopped may be logged but not in evaluations.json)
    assert len(steps) >= len(evaluations) and (distance > 0).all()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["videos"]
    frames = read_frames(run_dir / summary["videos"][0])
    assert frames.shape[1:] == (48, 48, 3)  # made with eval.video.render_kwargs
    up.assert_no_orphans()
