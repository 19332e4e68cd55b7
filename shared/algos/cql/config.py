"""CQL's settings: DQN's, plus the conservative penalty's weight."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlfleet.shared.algos.dqn.config import DQNConfig


class CQLConfig(DQNConfig):
    """Discrete CQL (Kumar et al. 2020): DQN's double-DQN target plus a conservative penalty,
    so Q-values of actions the dataset never took are pushed down rather than trusted."""

    # its own name, narrowing the parent's: what the run config's union tells them apart by
    name: Literal["cql"] = "cql"  # type: ignore[assignment]
    cql_alpha: float = Field(1.0, ge=0, description="weight of logsumexp_a Q(s, a) - "
                             "Q(s, a_data)")
