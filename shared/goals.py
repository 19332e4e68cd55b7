"""Goal-conditioned envs (gymnasium-robotics' `GoalEnv` style): how their observations are
carried, and how their success is measured.

Their observations are dicts, `observation`, `achieved_goal` and `desired_goal`. Chunks,
codecs, networks and datasets all handle one array per row, so the env wrapper flattens the
dict into one float32 vector in that fixed key order (`FlattenGoalObs`) and the env's spec
records where each part lies (`GoalLayout`). The learner reads the layout to relabel goals
(hindsight experience replay), and calls the env's own `compute_reward` on the flattened
parts.

Success is what such envs report in `info["is_success"]` on an episode's last step;
`evaluate_goals` counts it beside the returns.
"""

from __future__ import annotations

from dataclasses import dataclass

import gymnasium as gym
import numpy as np

GOAL_KEYS = ("observation", "achieved_goal", "desired_goal")


@dataclass(frozen=True)
class GoalLayout:
    """[start, stop) of each part of a flattened goal observation."""

    observation: tuple[int, int]
    achieved_goal: tuple[int, int]
    desired_goal: tuple[int, int]

    def part(self, name: str) -> slice:
        start, stop = getattr(self, name)
        return slice(start, stop)


def is_goal_space(space: gym.Space) -> bool:
    return isinstance(space, gym.spaces.Dict) and set(GOAL_KEYS) <= set(space.spaces)


class FlattenGoalObs(gym.ObservationWrapper):
    """A goal dict observation as one float32 vector: observation, achieved_goal,
    desired_goal, each flattened (other keys of the dict are dropped)."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        spaces = env.observation_space
        if not is_goal_space(spaces):
            raise ValueError(f"not a goal observation space: {spaces}")
        self._parts = [spaces[k] for k in GOAL_KEYS]
        flat = [gym.spaces.flatten_space(s) for s in self._parts]
        bounds, start = [], 0
        for box in flat:
            bounds.append((start, start + int(box.shape[0])))
            start += int(box.shape[0])
        self.goal_layout = GoalLayout(*bounds)
        self.observation_space = gym.spaces.Box(
            np.concatenate([b.low for b in flat]).astype(np.float32),
            np.concatenate([b.high for b in flat]).astype(np.float32), dtype=np.float32)

    def observation(self, observation: dict) -> np.ndarray:
        return np.concatenate([gym.spaces.flatten(s, observation[k]).astype(np.float32)
                               for s, k in zip(self._parts, GOAL_KEYS, strict=True)])


def _success_at_end(info: dict, i: int) -> bool:
    """`is_success` of env i's finished episode (same-step autoreset keeps the final step's
    info under `final_info`)."""
    for source in (info.get("final_info") or {}, info):
        if "is_success" in source and source.get("_is_success", np.ones(i + 1, bool))[i]:
            return bool(source["is_success"][i])
    return False


def evaluate_goals(envs: gym.vector.VectorEnv, policy, episodes: int, seed: int,
                   deterministic: bool = True) -> tuple[list[float], list[bool]]:
    """Run exactly `episodes` episodes spread evenly over the envs (as the collectors'
    evaluation does); each one's return and whether it ended in success."""
    n = envs.num_envs
    quota = np.array([episodes // n + (1 if i < episodes % n else 0) for i in range(n)])
    obs, _ = envs.reset(seed=seed)
    ep_return = np.zeros(n)
    returns: list[float] = []
    successes: list[bool] = []
    pre = getattr(policy, "preprocess", None)  # algo.obs_norm: the version's statistics
    while (quota > 0).any():
        actions = policy.act_eval(obs if pre is None else pre(obs), deterministic)
        obs, reward, terminated, truncated, info = envs.step(actions)
        active = quota > 0
        ep_return += np.where(active, reward, 0.0)
        for i in np.flatnonzero((terminated | truncated) & active):
            returns.append(float(ep_return[i]))
            successes.append(_success_at_end(info, i))
            quota[i] -= 1
            ep_return[i] = 0.0
    return returns, successes
