"""DQN's settings."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlfleet.shared.contract.algo import (
    AlgoConfig,
    EpsilonGreedySettings,
    HindsightSettings,
    NStepSettings,
    PrioritySettings,
)


class DQNConfig(HindsightSettings, NStepSettings, PrioritySettings, EpsilonGreedySettings,
                AlgoConfig):
    """Double DQN with a target network: epsilon-greedy acting, n-step returns, priorities
    for a prioritized buffer, hindsight relabelling for goal envs."""

    name: Literal["dqn"] = "dqn"
    target_update_every: int = Field(250, ge=1, description="train iterations between hard "
                                     "target-network copies")
