"""`rlfleet play RUN_DIR`: the run's trained policy playing the run's env, episode by episode.

The policy is the one the run kept as its result (`best_policy.safetensors`, loaded as
`rlfleet export --source policy` loads it), or with `--checkpoint N` the one of the
learner's checkpoint at train iteration N (`rlfleet checkpoints RUN_DIR` lists them,
`services/checkpoints_cli.py`); the env is the run's own (`config.yaml`: its id,
kwargs, Atari preprocessing), one env stepped in this process. By default the policy acts as
evaluations act it (its deterministic action: DQN's greedy one, PPO's most likely action or
its Gaussian's mean); `--stochastic` acts as collectors do (DQN: epsilon at its final value;
PPO: sampled). Observations are normalised as the policy's version says (`algo.obs_norm`).

Envs that report success (`info["is_success"]` at an episode's last step, as
gymnasium-robotics' goal envs and `rlfleet/BitFlip-v0` do) get a success column and the
success rate; other envs print none rather than a rate of 0.

`--video PATH` records the first episode: the env is made with `render_mode="rgb_array"` and
its frames are written as MP4 (`shared/telemetry/video.py`, the `video` extra). An env that cannot
render, a run directory without a config or a best policy, and a self-play run (its moves
are masked, and `rlfleet battle` plays it against bots) are one-line errors (exit code 2).

`trained_policy` and `policy_actions` are what `rlfleet serve-policy` acts with too
(`services/policy_server.py`).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from rlfleet.export import COLLECTING_ENV_STEP, load_best_policy
from rlfleet.shared.algos.capabilities import NormalizesObservations, Recurrent
from rlfleet.shared.contract.config import ConfigError
from rlfleet.shared.contract.wire.evaluation import success_rate
from rlfleet.shared.envs.goals import episode_success
from rlfleet.shared.run.config import RunConfig, read_run_config
from rlfleet.shared.telemetry.video import VideoUnavailable

if TYPE_CHECKING:
    import gymnasium as gym

    from rlfleet.shared.algos.base import Policy

DEFAULT_FPS = 30


@dataclass
class Played:
    run_dir: Path
    env_id: str
    algo: str
    policy_version: int
    deterministic: bool
    seed: int
    returns: list[float]
    lengths: list[int]
    video: Path | None = None
    frames: int = 0
    # each episode's last `info["is_success"]`; None where the env reports no success
    successes: list[bool | None] = field(default_factory=list)
    checkpoint: int | None = None  # --checkpoint: the train iteration of the one played

    @property
    def mean_return(self) -> float:
        return float(np.mean(self.returns)) if self.returns else float("nan")

    @property
    def success_rate(self) -> float | None:
        """Goal-conditioned envs: the share of episodes that reached their goal."""
        return success_rate(self.successes)


def trained_policy(run_dir: Path, seed: int | None = None, checkpoint: int | None = None
                   ) -> tuple[RunConfig, Policy, int]:
    """A run's config, its best policy (or, with `checkpoint`, the policy of its checkpoint
    at that train iteration) ready to act, and that policy's version. Self-play runs are
    refused: their policy acts on masked moves of a two-player game."""
    cfg = read_run_config(run_dir)
    if cfg.league is not None:
        raise ConfigError(f"{run_dir} is a self-play run (a two-player game with masked "
                          f"moves); `rlfleet battle {run_dir}` plays its policy against bots")
    if checkpoint is not None:
        from rlfleet.checkpoints_cli import checkpoint_policy

        policy, version = checkpoint_policy(cfg, run_dir, checkpoint, seed)
        return cfg, policy, version
    policy, version = load_best_policy(cfg, run_dir, seed)
    return cfg, policy, version


def policy_actions(policy: Policy, obs: np.ndarray, deterministic: bool = True) -> np.ndarray:
    """One forward pass over a batch of raw observations: the deterministic actions of an
    evaluation, or (`deterministic=False`) the actions a collector takes."""
    if isinstance(policy, NormalizesObservations):  # algo.obs_norm: the version's statistics
        obs = policy.preprocess(obs)
    if deterministic:
        return np.asarray(policy.act_eval(obs, True))
    return np.asarray(policy.act(obs, COLLECTING_ENV_STEP).actions)


def _play_env(cfg: RunConfig, seed: int, render: bool) -> gym.vector.VectorEnv:
    """One env of the run's kind, stepped in this process (an `async` backend's subprocess
    buys nothing for one env); with `render`, made to render rgb_array frames."""
    from rlfleet.shared.envs.make import make_vector_env, with_step_cap

    env_cfg = with_step_cap(cfg.env, cfg.eval.max_steps)  # an endless env: cut, not hung
    updates: dict = {"backend": "sync"} if env_cfg.backend == "async" else {}
    if render:
        if env_cfg.backend == "envpool":
            raise VideoUnavailable(f"env {env_cfg.id!r} runs on EnvPool (env.backend: "
                                   "envpool), which renders no frames")
        updates["kwargs"] = {**env_cfg.kwargs, "render_mode": "rgb_array"}
        # Frames are drawn off-screen: SDL (pygame's classic-control renderer) needs no display
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    try:
        with warnings.catch_warnings():  # an undeclared render mode: tried all the same
            warnings.filterwarnings("ignore", message=".*render_mode.*")
            return make_vector_env(env_cfg.model_copy(update=updates), 1, seed)
    except TypeError as err:
        if not render:
            raise
        why = ("its constructor takes no render_mode" if "render_mode" in str(err)
               else f"{err}")
        raise VideoUnavailable(f"env {env_cfg.id!r} cannot render: {why}") from None


def _frame(envs: gym.vector.VectorEnv, env_id: str) -> np.ndarray:
    rendered = envs.render()
    frame = rendered[0] if isinstance(rendered, (tuple, list)) and rendered else rendered
    arr = None if frame is None else np.asarray(frame)
    if arr is None or arr.ndim != 3 or arr.shape[-1] not in (3, 4):
        raise VideoUnavailable(f"env {env_id!r} cannot render rgb_array frames (render() "
                               f"gave {None if arr is None else arr.shape})")
    return arr


def play_run(run_dir: str | Path, episodes: int = 10, video: str | Path | None = None,
             stochastic: bool = False, seed: int | None = None,
             checkpoint: int | None = None) -> Played:
    """Play `episodes` whole episodes one after another from `seed` (default: the run's
    seed); with `video`, write the first one's frames there as MP4; with `checkpoint`, with
    the policy of the run's checkpoint at that train iteration."""
    from rlfleet.shared.telemetry.video import Mp4Writer

    if episodes < 1:
        raise ConfigError(f"--episodes={episodes}: play at least one episode")
    run_dir = Path(run_dir)
    cfg, policy, version = trained_policy(run_dir, seed, checkpoint)
    seed = cfg.seed if seed is None else seed
    deterministic = not stochastic
    try:
        envs = _play_env(cfg, seed, render=video is not None)
    except VideoUnavailable as err:
        raise ConfigError(f"--video: {err}") from None
    writer = None
    returns: list[float] = []
    lengths: list[int] = []
    successes: list[bool | None] = []
    try:
        fps = int(envs.metadata.get("render_fps") or DEFAULT_FPS)
        if video is not None:  # frames go to ffmpeg as they come: none are held in memory
            Path(video).parent.mkdir(parents=True, exist_ok=True)
            try:
                writer = Mp4Writer(video, fps)
            except VideoUnavailable as err:
                raise ConfigError(f"--video: {err}") from None
        obs, _ = envs.reset(seed=seed)
        recurrent = policy if isinstance(policy, Recurrent) else None
        if recurrent is not None:  # a fresh memory for the first episode, then at each end
            recurrent.reset_state(None, evaluation=True)
        for episode in range(episodes):
            record = video is not None and episode == 0
            total, length = 0.0, 0
            while True:
                if record and writer is not None:
                    try:
                        writer.add(_frame(envs, cfg.env.id))
                    except VideoUnavailable as err:
                        raise ConfigError(f"--video: {err}") from None
                # Vector envs reset a finished env within the step (same-step autoreset):
                # `obs` is then already the next episode's first observation.
                obs, reward, terminated, truncated, info = envs.step(
                    policy_actions(policy, obs, deterministic))
                total += float(reward[0])
                length += 1
                if terminated[0] or truncated[0]:
                    if recurrent is not None:
                        recurrent.reset_state(None, evaluation=True)
                    break
            returns.append(total)
            lengths.append(length)
            successes.append(episode_success(info, 0))
    except ConfigError:  # no half-written video is left behind
        if writer is not None:
            writer.close()
            writer.path.unlink(missing_ok=True)
            writer = None
        raise
    finally:
        envs.close()
        if writer is not None:
            writer.close()
    played = Played(run_dir, cfg.env.id, cfg.algo.name, version, deterministic, seed,
                    returns, lengths, successes=successes, checkpoint=checkpoint)
    if writer is not None and video is not None:
        played.video, played.frames = Path(video), writer.frames
    return played


def print_played(played: Played) -> None:
    from rich.console import Console
    from rich.table import Table

    mode = "deterministic" if played.deterministic else "stochastic (as collectors act)"
    console = Console(highlight=False)
    source = ("" if played.checkpoint is None
              else f" (checkpoint at train iteration {played.checkpoint})")
    console.print(f"{played.run_dir}: {played.algo} policy version {played.policy_version}"
                  f"{source} on {played.env_id}, {mode}, seed {played.seed}")
    rate = played.success_rate  # a column only for envs that report success
    table = Table()
    table.add_column("episode", justify="right")
    table.add_column("return", justify="right")
    table.add_column("length", justify="right")
    if rate is not None:
        table.add_column("success", justify="right")
    for i, (ret, length) in enumerate(zip(played.returns, played.lengths, strict=True)):
        success = [] if rate is None else [_yes_no(played.successes[i])]
        table.add_row(str(i + 1), f"{ret:.2f}", str(length), *success)
    table.add_section()
    table.add_row("mean", f"{played.mean_return:.2f}", f"{np.mean(played.lengths):.1f}",
                  *([] if rate is None else [f"{rate:.2f}"]))
    console.print(table)
    if rate is not None:
        known = [s for s in played.successes if s is not None]
        console.print(f"success rate: {rate:.2f} ({sum(known)} of {len(known)} episodes "
                      "reached their goal)")
    if played.video is not None:
        console.print(f"video of episode 1: {played.video} ({played.frames} frames)")


def _yes_no(success: bool | None) -> str:
    return "-" if success is None else "yes" if success else "no"
