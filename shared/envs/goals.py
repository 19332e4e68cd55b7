"""Goal-conditioned envs (gymnasium-robotics' `GoalEnv` style): how their observations are
carried, and how their success is measured.

Their observations are dicts, `observation`, `achieved_goal` and `desired_goal`. Chunks,
codecs, networks and datasets all handle one array per row, so the env wrapper flattens the
dict into one float32 vector in that fixed key order (`FlattenGoalObs`) and the env's spec
records where each part lies (`GoalLayout`). The learner reads the layout to relabel goals
(hindsight experience replay), and calls the env's own `compute_reward` on the flattened
parts.

Success is what such envs report in `info["is_success"]` on an episode's last step
(`episode_success`); evaluations count it beside the returns
(`rlfleet.shared.rollout.rollout.evaluate`, `rlfleet play`), and an env that reports none
has a success rate of None, not 0.
"""

from __future__ import annotations

from typing import Any, TypeGuard

import gymnasium as gym
import numpy as np

from rlfleet.shared.contract.spec import GoalLayout

GOAL_KEYS = ("observation", "achieved_goal", "desired_goal")


def is_goal_space(space: gym.Space) -> TypeGuard[gym.spaces.Dict]:
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
        flat: list[gym.spaces.Box] = []
        for key, part in zip(GOAL_KEYS, self._parts, strict=True):
            box = gym.spaces.flatten_space(part)
            if not isinstance(box, gym.spaces.Box):
                raise ValueError(f"observation_space[{key!r}]: {part} does not flatten to a Box")
            flat.append(box)
        bounds, start = [], 0
        for box in flat:
            bounds.append((start, start + int(box.shape[0])))
            start += int(box.shape[0])
        self.goal_layout = GoalLayout(*bounds)
        self.observation_space = gym.spaces.Box(
            np.concatenate([b.low for b in flat]).astype(np.float32),
            np.concatenate([b.high for b in flat]).astype(np.float32), dtype=np.float32)

    def observation(self, observation: dict) -> np.ndarray:
        return np.concatenate([np.asarray(gym.spaces.flatten(s, observation[k]), np.float32)
                               for s, k in zip(self._parts, GOAL_KEYS, strict=True)])


def _final_source(info: dict, i: int) -> dict:
    """The info dict that holds env i's final step. Same-step autoreset keeps it under
    `final_info` (the top level then holds the next episode's reset info, which must not
    count)."""
    final, has_final = info.get("final_info"), info.get("_final_info")
    return final if final and (has_final is None or has_final[i]) else info


def episode_success(info: dict, i: int) -> bool | None:
    """Whether env i's episode, which ended at this vector step, ended in success: its final
    step's `info["is_success"]`. None when the env reports no success: "not measured" must
    not read as "failed"."""
    source = _final_source(info, i)
    if "is_success" not in source:
        return None
    present = source.get("_is_success")
    return bool(source["is_success"][i]) if present is None or present[i] else None


def episode_info(info: dict, i: int, key: str) -> float | None:
    """A number env i's final step reported under `key` (a dotted path into nested info
    dicts: `episode.r` for gymnasium's RecordEpisodeStatistics), as a float; None where that
    env's info does not hold a finite number there (`eval.info_keys`,
    `eval.episode_return_key`)."""
    source: Any = _final_source(info, i)
    *parents, leaf = key.split(".")
    for part in parents:
        mask = source.get(f"_{part}") if isinstance(source, dict) else None
        if not isinstance(source, dict) or part not in source or (
                mask is not None and not mask[i]):
            return None
        source = source[part]
    if not isinstance(source, dict) or leaf not in source:
        return None
    present = source.get(f"_{leaf}")
    if present is not None and not present[i]:
        return None
    try:
        value = float(np.asarray(source[leaf])[i])
    except (TypeError, ValueError, IndexError):
        return None
    return value if np.isfinite(value) else None
