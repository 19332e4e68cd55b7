"""A user's own code, named by import path in configs (`my_rl:...`): an environment and a
policy that rlfleet knows nothing about. Tests put this directory on PYTHONPATH, the way a
user would make their package importable on every worker."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlfleet import LearnerHook
from rlfleet.shared.algos.dqn import DQN
from rlfleet.shared.algos.nets import mlp


class LineWalk(gym.Env):
    """Walk from the middle of a line to its right end: 2 actions, reward -0.05 per step and
    +1 at the goal; 30 steps at most. A greedy policy returns 1 - 0.05 * 4 = 0.8."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, size: int = 9) -> None:
        self.size = size
        self.observation_space = gym.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.pos = size // 2
        self.t = 0

    def _obs(self) -> np.ndarray:
        x = 2.0 * self.pos / (self.size - 1) - 1.0
        return np.array([x, self.t / 30.0], dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.pos, self.t = self.size // 2, 0
        return self._obs(), {}

    def step(self, action):
        self.pos = int(np.clip(self.pos + (1 if int(action) == 1 else -1), 0, self.size - 1))
        self.t += 1
        at_goal = self.pos == self.size - 1
        reward = 1.0 if at_goal else -0.05
        return self._obs(), reward, at_goal, self.t >= 30 and not at_goal, {}


class LengthByIndex(gym.Env):
    """The k-th instance made in a process runs episodes of 2 * (k + 1) steps, reward 1 per
    step: in a vector env, env i's episodes are twice as long as env 0's times (i + 1)."""

    metadata: dict[str, Any] = {"render_modes": []}
    made = 0

    def __init__(self) -> None:
        self.length = 2 * (LengthByIndex.made + 1)
        LengthByIndex.made += 1
        self.observation_space = gym.spaces.Box(0.0, 100.0, shape=(1,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([float(self.length)], dtype=np.float32), {}

    def step(self, action):
        self.t += 1
        obs = np.array([float(self.length)], dtype=np.float32)
        return obs, 1.0, self.t >= self.length, False, {}


class DuelingQ(nn.Module):
    """Q = V + A - mean(A): the dueling architecture, as a user would bring it."""

    def __init__(self, in_dim: int, hidden: tuple[int, ...], n_actions: int) -> None:
        super().__init__()
        self.body = mlp(in_dim, hidden[:-1], hidden[-1])
        self.value = nn.Linear(hidden[-1], 1)
        self.advantage = nn.Linear(hidden[-1], n_actions)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.body(obs.flatten(1)))
        a = self.advantage(h)
        return self.value(h) + a - a.mean(dim=1, keepdim=True)


class DuelingDQN(DQN):
    """Double DQN with a dueling Q-network; `algo.params.tag` shows free-form settings reach
    the user's class."""

    def __init__(self, cfg, spec, seed: int = 0) -> None:
        super().__init__(cfg, spec, seed)
        self.tag = cfg.params.get("tag", "")
        in_dim = int(np.prod(spec.obs_shape))
        self.q = DuelingQ(in_dim, cfg.hidden_sizes, spec.n_actions)
        self.target = DuelingQ(in_dim, cfg.hidden_sizes, spec.n_actions)
        self.target.load_state_dict(self.q.state_dict())
        self.target.requires_grad_(False)
        self.optimizer = torch.optim.Adam(self.q.parameters(), lr=cfg.lr)
        self._params = list(self.q.parameters())


NOT_A_POLICY = 42


class GroupDQNWithoutArgument(DQN):
    """A hook with the wrong signature: the learner calls `set_reducer(reducer)`."""

    def set_reducer(self) -> None:  # type: ignore[override]
        self.reducer = None


class HalfNormalizingDQN(DQN):
    """Defines one of NormalizesObservations' members: the collector would never call it."""

    def preprocess(self, obs: np.ndarray) -> np.ndarray:
        return obs / 2.0


class MisspeltHookDQN(DQN):
    """`merge_obs_stat`: one letter short of a hook, which would never be called."""

    def merge_obs_stat(self, moments) -> None:
        pass


class TwoObjectiveWalk(LineWalk):
    """LineWalk with a vector reward: (progress reward, -0.01 energy per step)."""

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, np.array([reward, -0.01]), terminated, truncated, info


class SlowCartPole(gym.Wrapper):
    """CartPole-v1 whose step takes at least `step_s` seconds, like a slow simulator: the
    collectors, not the CPU, are then what limits env steps/s."""

    def __init__(self, step_s: float = 0.002) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.step_s = step_s

    def step(self, action):
        time.sleep(self.step_s)
        return self.env.step(action)


class CrashingCartPole(gym.Wrapper):
    """CartPole whose `step()` raises after `after_steps` steps of this instance (0: at
    once). `in_eval_only`: only while an evaluation steps it (the collector's
    `evaluate` is on the stack), so collection goes on and the evaluation crashes."""

    def __init__(self, after_steps: int = 0, message: str = "the simulator lost its licence",
                 in_eval_only: bool = False) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.after_steps = after_steps
        self.message = message
        self.in_eval_only = in_eval_only
        self.steps = 0

    def step(self, action):
        self.steps += 1
        if self.steps > self.after_steps and (not self.in_eval_only or _evaluating()):
            raise RuntimeError(self.message)
        return self.env.step(action)


def _evaluating() -> bool:
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "evaluate" and "rollout" in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False


class NaNMetricDQN(DQN):
    """DQN whose every third update reports a NaN `wobble` (1.0 otherwise) and every update a
    `q_per_action` array, as a user's policy might: the learner must deliver its reports
    anyway, count the NaNs and pass the array to the logger."""

    def learn(self, batch, weights=None):
        out = super().learn(batch, weights)
        n = self.train_iterations
        out.metrics["wobble"] = torch.tensor(float("nan") if n % 3 == 0 else 1.0)
        out.metrics["q_per_action"] = torch.tensor([1.0, 2.0, float(n % 5)])
        return out


class CrashingDQN(DQN):
    """DQN whose update raises once per run, at train iteration `algo.params.crash_at`; the
    file `algo.params.marker` records that it did, so the restarted learner trains on."""

    def learn(self, batch, weights=None):
        marker = Path(self.cfg.params["marker"])
        if self.train_iterations + 1 >= int(self.cfg.params["crash_at"]) and \
                not marker.exists():
            marker.write_text(str(self.train_iterations))
            raise RuntimeError("the user's update broke")
        return super().learn(batch, weights)


class ScoredByIndex(LengthByIndex):
    """LengthByIndex whose last step's info reports `distance` (the episode's length) and, as
    gymnasium's RecordEpisodeStatistics would, `episode.r`: a true score of 100 per step that
    the rewards (1 a step) do not show. It renders flat frames of `frame_size` pixels."""

    metadata: dict[str, Any] = {"render_modes": ["rgb_array"], "render_fps": 30}

    def __init__(self, frame_size: int = 32, render_mode: str | None = None) -> None:
        super().__init__()
        self.frame_size = frame_size
        self.render_mode = render_mode

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        if terminated:
            info = {"distance": float(self.length), "episode": {"r": 100.0 * self.length}}
        return obs, reward, terminated, truncated, info

    def render(self):
        shade = (40 * self.t) % 256
        return np.full((self.frame_size, self.frame_size, 3), shade, dtype=np.uint8)


# -- learner hooks and a metric writer, as a user writes them (docs/extending.md) ------------

HOOK_ORDER: list[str] = []  # the stages as this process ran them, across hooks


class CountingHook(LearnerHook):
    """Counts updates, adds each update's batch size as `hook_batch_rows` to its metrics, and
    writes what it saw to `out` (JSON) after the run."""

    def __init__(self, out: str, name: str = "counting") -> None:
        self.out, self.name, self.updates, self.rows = Path(out), name, 0, 0

    def before_run(self, ctx) -> None:
        HOOK_ORDER.append(f"{self.name}.before_run")
        self.started_at = ctx.train_iterations

    def before_iter(self, ctx) -> None:
        self.rows = int(next(iter(ctx.batch.values())).shape[0])

    def after_iter(self, ctx) -> None:
        self.updates += 1
        ctx.metrics["hook_batch_rows"] = float(self.rows)

    def after_run(self, ctx) -> None:
        HOOK_ORDER.append(f"{self.name}.after_run")
        self.out.write_text(json.dumps({
            "order": HOOK_ORDER, "updates": self.updates, "started_at": self.started_at,
            "train_iterations": ctx.train_iterations, "rank": ctx.rank}))


class FirstHook(LearnerHook):
    """Only marks its stages: with a lower priority it runs before CountingHook."""

    def before_run(self, ctx) -> None:
        HOOK_ORDER.append("first.before_run")

    def after_run(self, ctx) -> None:
        HOOK_ORDER.append("first.after_run")


class JsonLinesWriter:
    """A metric writer of the user's: every record as a JSON line of `path`."""

    def __init__(self, run_dir, run_name: str, config: dict, resume: bool, path: str) -> None:
        self.file = Path(path).open("a", encoding="utf-8")  # noqa: SIM115 - until close()
        self.run_name = run_name

    def write(self, scope: str, step: int, wall_time: float, scalars) -> None:
        self.file.write(json.dumps({"run": self.run_name, "scope": scope, "step": step,
                                    **scalars}) + "\n")

    def flush(self) -> None:
        self.file.flush()

    def close(self) -> None:
        self.file.close()


class SampleLogHook(LearnerHook):
    """Logs per-sample values with the batch log (`ctx.add_log`): each row's reward, and its
    row number in the batch (so a test can tell the values line up with their samples); and
    a value that is not one per row, which the batch log refuses (it warns, and goes on)."""

    def after_iter(self, ctx) -> None:
        if not ctx.logging_samples:
            return
        rows = int(ctx.batch["reward"].shape[0])
        ctx.add_log("reward", ctx.batch["reward"])
        ctx.add_log("row", list(range(rows)))
        ctx.add_log("not_per_row", [1.0, 2.0])
