"""R2D2's settings."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlfleet.shared.contract.algo import AlgoConfig, EpsilonGreedySettings, PrioritySettings


class R2D2Config(PrioritySettings, EpsilonGreedySettings, AlgoConfig):
    """Recurrent replay distributed DQN (Kapturowski et al. 2019): an LSTM Q-network learning
    from fixed-length sequences of a `sequence` buffer, each started from the recurrent state
    the collector stored, warmed up over `burn_in` rows, with n-step double-Q targets in the
    value-rescaled space and sequence priorities."""

    name: Literal["r2d2"] = "r2d2"
    hidden_sizes: tuple[int, ...] = Field((64,), description="MLP widths before the LSTM")
    lstm_size: int = Field(64, ge=1, le=4096, description="units of the LSTM's state")
    burn_in: int = Field(0, ge=0, description="rows at each sequence's start that only warm "
                         "the stored state up (no gradient, no loss): R2D2's 40 of 80")
    n_step: int = Field(5, ge=1, le=100, description="n-step returns inside each sequence "
                        "(never across an episode's end or the sequence's end; the learner's "
                        "batch transforms do not apply)")
    value_rescaling: bool = Field(True, description="targets in the space of "
                                  "h(x) = sign(x)(sqrt(|x| + 1) - 1) + eps x, bootstrapped "
                                  "through its inverse, instead of reward clipping")
    rescale_eps: float = Field(1e-3, gt=0, le=1, description="the eps of h")
    priority_eta: float = Field(0.9, ge=0, le=1, description="a sequence's priority: eta x max "
                                "|TD error| + (1 - eta) x mean |TD error| over its rows")
    target_update_every: int = Field(250, ge=1, description="train iterations between hard "
                                     "target-network copies")
