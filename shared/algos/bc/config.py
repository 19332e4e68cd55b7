"""Behaviour cloning's settings: the ones every algorithm has."""

from __future__ import annotations

from typing import Literal

from rlfleet.shared.contract.algo import AlgoConfig


class BCConfig(AlgoConfig):
    """Behaviour cloning: maximum likelihood of the dataset's actions (cross-entropy over
    discrete actions, squared error for continuous ones)."""

    name: Literal["bc"] = "bc"
