"""Recording the evaluated policy: deterministic episodes on one env that renders frames.

The recording runs after the evaluation's own episodes, on an env of its own made with
`render_mode="rgb_array"`, so rendering costs the evaluation's figures nothing and a failure
to render costs them nothing either: `VideoUnavailable` says why, the collector warns once and
goes on without videos. Frames go to ffmpeg as they are rendered (`Mp4Writer`), never held.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rlfleet.shared.algos.base import Policy
from rlfleet.shared.algos.capabilities import NormalizesObservations, Recurrent
from rlfleet.shared.contract.config import EnvConfig, VideoConfig
from rlfleet.shared.envs.make import make_render_env
from rlfleet.shared.telemetry.video import Mp4Writer, VideoUnavailable


@dataclass
class Recording:
    mp4: bytes
    gif: bytes
    frames: int
    returns: list[float]


def record(env_cfg: EnvConfig, policy: Policy, video: VideoConfig, seed: int) -> Recording:
    """`video.episodes` greedy episodes, at most `video.max_frames` frames in all."""
    try:
        env = make_render_env(env_cfg, video.render_kwargs)
    except Exception as err:  # an env that cannot be made to render
        raise VideoUnavailable(f"cannot make {env_cfg.id} with render_mode='rgb_array': "
                               f"{err}") from err
    # algo.obs_norm: the version's statistics
    pre = policy.preprocess if isinstance(policy, NormalizesObservations) else None
    returns: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        out = Mp4Writer(Path(tmp) / "video.mp4", video.fps)
        try:
            for episode in range(video.episodes):
                obs, _ = env.reset(seed=seed + episode)
                if isinstance(policy, Recurrent):  # a fresh memory for each episode
                    policy.reset_state(None, evaluation=True)
                out.add(_frame(env))
                total, done = 0.0, False
                while not done and out.frames < video.max_frames:
                    batch = obs[None] if pre is None else pre(obs[None])
                    action = policy.act_eval(batch, True)[0]
                    obs, reward, terminated, truncated, _ = env.step(action)
                    total += float(reward)
                    done = bool(terminated or truncated)
                    out.add(_frame(env))
                returns.append(total)
                if out.frames >= video.max_frames:
                    break
        finally:
            env.close()
            out.close()
        return Recording(out.path.read_bytes(), out.gif(), out.frames, returns)


def _frame(env) -> np.ndarray:
    try:
        frame = env.render()
    except Exception as err:  # NotImplementedError, a missing display library, ...
        raise VideoUnavailable(f"the env cannot render: {type(err).__name__}: {err}") from err
    if frame is None:
        raise VideoUnavailable("the env rendered nothing (it has no rgb_array render mode)")
    return np.asarray(frame)
