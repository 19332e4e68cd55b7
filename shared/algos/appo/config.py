"""APPO's settings: PPO's, plus V-trace's truncation levels and IMPALA mode."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlfleet.shared.algos.ppo.config import PPOConfig


class APPOConfig(PPOConfig):
    """Asynchronous PPO: the clipped surrogate on V-trace targets, learning from whatever a
    queue buffer holds, however old the policy that acted it."""

    # its own name, narrowing the parent's: what the run config's union tells them apart by
    name: Literal["appo"] = "appo"  # type: ignore[assignment]
    epochs: int = Field(1, ge=1, le=100, description="passes over each rollout (off-policy "
                        "data is used once or twice, not PPO's four times)")
    rollout_size: int = Field(512, ge=1, description="transitions per learn round: whole "
                              "chunks are gathered until at least this many; small, so the "
                              "learner never waits for a synchronous rollout")
    max_policy_lag: int | None = Field(None, ge=0, description="null: no chunk is dropped for "
                                       "its age (V-trace corrects for it); a number drops as "
                                       "PPO does")
    gae_lambda: float = Field(1.0, ge=0, le=1, description="V-trace's lambda: the traces c "
                              "are lambda * min(c_bar, rho)")
    rho_bar: float = Field(1.0, gt=0, description="V-trace: importance weights in the TD "
                           "errors and the advantages are truncated at this")
    c_bar: float = Field(1.0, gt=0, description="V-trace: importance weights in the traces are "
                         "truncated at this (at most rho_bar)")
    impala: bool = Field(False, description="IMPALA's policy gradient, -A * log pi with "
                         "V-trace advantages, instead of the clipped surrogate")
