"""SAC's settings."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rlfleet.shared.contract.algo import (
    AlgoConfig,
    NStepSettings,
    ObsNormSettings,
    PrioritySettings,
)


class SACConfig(ObsNormSettings, NStepSettings, PrioritySettings, AlgoConfig):
    """Soft Actor-Critic (Haarnoja et al. 2018, with the automatic temperature of their
    'SAC: Algorithms and Applications'): twin Q-networks with Polyak-averaged targets, a
    tanh-squashed Gaussian policy and an entropy temperature tuned towards a target entropy.
    Updates per env step are the replay ratio the buffer's rate limiter holds
    (`buffers.<name>.rate_limit.samples_per_insert` = updates per env step x `batch_size`)."""

    name: Literal["sac"] = "sac"
    hidden_sizes: tuple[int, ...] = Field((256, 256), description="MLP widths of the actor "
                                          "and of each Q-network")
    lr: float = Field(3e-4, gt=0, description="learning rate of the actor, the Q-networks and "
                      "the temperature (one Adam)")
    batch_size: int = Field(256, ge=1, le=65536, description="transitions per gradient step")
    max_grad_norm: float = Field(100.0, gt=0, description="the actor's and the Q-networks' "
                                 "gradients are each clipped to this global L2 norm (a guard "
                                 "against spikes: the reference implementations do not clip)")
    tau: float = Field(0.005, gt=0, le=1, description="Polyak averaging of the target "
                       "Q-networks after every gradient step: target += tau * (online - "
                       "target)")
    init_alpha: float = Field(1.0, gt=0, description="the entropy temperature alpha at the "
                              "start (kept there when autotune is off)")
    autotune: bool = Field(True, description="learn alpha so the policy's entropy tracks "
                           "target_entropy (the loss -log(alpha) * (log pi + target_entropy))")
    target_entropy: float | None = Field(None, description="the entropy autotune aims at, in "
                                         "nats of the squashed action in [-1, 1]^|A|; null: "
                                         "-|A|, the number of action dimensions negated")
    random_steps: int = Field(5000, ge=0, description="env steps of the run (all collectors' "
                              "together) acted uniformly at random in the action space before "
                              "the policy acts, as SB3's learning_starts and CleanRL's "
                              "learning_starts do; collectors may act so before torch loads")
    log_std_min: float = Field(-5.0, description="the policy's log std is squashed into "
                               "[log_std_min, log_std_max] (CleanRL's bounds)")
    log_std_max: float = Field(2.0, description="upper bound of the policy's log std")

    @model_validator(mode="after")
    def _log_std_bounds(self) -> SACConfig:
        if self.log_std_min >= self.log_std_max:
            raise ValueError(f"log_std_min={self.log_std_min} must be below "
                             f"log_std_max={self.log_std_max}")
        return self
