"""Atari end to end: `rlfleet up` on Pong with one collector and the learner, DQN (replay
sampled by the learner's data process, stacks rebuilt from frames) and PPO (whole chunks
unpacked into rollouts). Chunks in storage hold each frame once, zstd-compressed, and
rebuild stacks that move on by one frame a step; the learner trains on them."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

pytest.importorskip("ale_py", reason="the atari extra: pip install -e '.[atari]'")

from rlfleet.shared.contract.codec import decode_arrays  # noqa: E402
from rlfleet.shared.contract.frames import FRAMES, unpack  # noqa: E402
from rlfleet.shared.infra.storage import DirectoryStorage  # noqa: E402

from .helpers import REPO  # noqa: E402


def _config(tmp_path, base: str):
    data = yaml.safe_load((REPO / "configs" / base).read_text())
    data["env"]["num_envs"] = 4
    data["env"]["atari"] = {"max_episode_frames": 1200}  # episode ends inside the run
    data["collector"]["chunk_size"] = 256
    for buffer in data["buffers"].values():
        buffer["rate_limit"]["min_size"] = 512
        buffer["rate_limit"]["error_buffer"] = 4096
        if buffer.get("kind") != "queue":  # a Nature CNN update of 32 stacks is slow
            buffer["rate_limit"]["samples_per_insert"] = 0.5  # on one core: keep them few
            buffer["rate_limit"]["error_buffer"] = 256
    data["learner"]["chunk_cache"] = 64
    data["eval"] = {"every_env_steps": 4000, "episodes": 2, "num_envs": 2, "stop_value": 21}
    data["stop"] = {"max_env_steps": 6000, "max_wall_s": 240}
    path = tmp_path / base
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.parametrize("base", ["pong-dqn.yaml", "breakout-ppo.yaml"])
def test_atari_trains_through_the_cluster_on_frames_stored_once(launch, tmp_path, base):
    run_dir = tmp_path / "run"
    up = launch("--config", str(_config(tmp_path, base)), "--collectors", "1",
                "--run-dir", str(run_dir), "--quiet", "--max-restarts", "0")
    code = up.wait(timeout=300)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert code == 3 and summary["error"] is None, (code, summary, up.stderr[-3000:])
    assert summary["env_steps"] >= 6000 and summary["train_iterations"] > 0
    assert summary["policy_version"] > 0 and summary["eval_return"] is not None

    storage = DirectoryStorage(run_dir / "storage")
    ids = storage.list_chunks()
    assert ids
    stored = rows = 0
    for blob in storage.get_chunks(ids[:8]):
        arrays, _ = decode_arrays(blob)
        assert FRAMES in arrays and "obs" not in arrays
        n = len(arrays["reward"])
        rows += n
        stored += len(blob)
        full = unpack(arrays)
        assert full["obs"].dtype == np.uint8 and full["obs"].shape == (n, 4, 84, 84)
        moved_on = (full["next_obs"][:, :3] == full["obs"][:, 1:]).all(axis=(1, 2, 3))
        assert moved_on.all()  # every next stack is the stack moved on by one frame
    assert stored / rows < 2000  # each frame once, compressed (whole: 56 KB a step)
