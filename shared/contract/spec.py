"""What a policy needs to know about an environment to be built: its `EnvSpec`.

A leaf module with no gymnasium in it: algorithms, datasets and games describe the env they
work with without importing the library that makes envs (`rlfleet.shared.envs.make.env_spec`
reads one off a real env).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GoalLayout:
    """[start, stop) of each part of a flattened goal observation (`observation`,
    `achieved_goal`, `desired_goal`: `rlfleet.shared.envs.goals`)."""

    observation: tuple[int, int]
    achieved_goal: tuple[int, int]
    desired_goal: tuple[int, int]

    def part(self, name: str) -> slice:
        start, stop = {"observation": self.observation, "achieved_goal": self.achieved_goal,
                       "desired_goal": self.desired_goal}[name]
        return slice(start, stop)


@dataclass(frozen=True)
class EnvSpec:
    """The shapes of an env's observations and actions."""

    obs_shape: tuple[int, ...]
    n_actions: int = 0                    # discrete: number of actions; 0 when continuous
    action_shape: tuple[int, ...] = ()    # continuous: shape of one action
    action_low: tuple[float, ...] = ()
    action_high: tuple[float, ...] = ()
    goal: GoalLayout | None = None        # goal-conditioned: the flattened obs's parts

    @property
    def discrete(self) -> bool:
        return self.n_actions > 0


# The Nature CNN's smallest input: 8x8/4, 4x4/2, 3x3/1 leave one cell of a 36x36 frame.
MIN_IMAGE_SIDE = 36


def is_image(obs_shape: tuple[int, ...] | list[int]) -> bool:
    """Observations a CNN reads: (channels or stacked frames, height, width), channel-first
    as gymnasium's Atari stack gives them, at least `MIN_IMAGE_SIDE` a side. Small 3-d
    observations (board planes such as Connect Four's (6, 7, 2)) stay with the MLP."""
    return len(obs_shape) == 3 and min(obs_shape[1:]) >= MIN_IMAGE_SIDE
