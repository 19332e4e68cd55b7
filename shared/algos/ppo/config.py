"""PPO's settings."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlfleet.shared.contract.algo import AlgoConfig, ObsNormSettings, RolloutSettings


class PPOConfig(ObsNormSettings, RolloutSettings, AlgoConfig):
    """PPO with the clipped surrogate objective and GAE(lambda), learning in rollouts of whole
    chunks from one queue buffer."""

    name: Literal["ppo"] = "ppo"
    hidden_sizes: tuple[int, ...] = Field((64, 64), description="MLP widths of actor and critic")
    lr: float = Field(3e-4, gt=0, description="learning rate")
    batch_size: int = Field(256, ge=1, le=65536, description="transitions per minibatch")
    max_grad_norm: float = Field(0.5, gt=0, description="gradients are clipped to this "
                                 "global L2 norm")
    epochs: int = Field(4, ge=1, le=100, description="passes over each rollout")
    gae_lambda: float = Field(0.95, ge=0, le=1, description="GAE's lambda")
    clip_coef: float = Field(0.2, gt=0, description="the surrogate's clip range")
    clip_vloss: bool = Field(False, description="clip the value loss like the policy loss")
    vf_coef: float = Field(0.5, ge=0, description="weight of the value loss")
    ent_coef: float = Field(0.0, ge=0, description="weight of the entropy bonus")
    norm_adv: bool = Field(True, description="normalise advantages per minibatch")
    reward_scale: float = Field(1.0, gt=0, description="rewards are multiplied by this before "
                                "GAE (returns are logged unscaled)")
    init_log_std: float = Field(0.0, description="continuous actions: initial log std")
    lr_anneal_rows: int | None = Field(None, ge=1, description="the learning rate falls "
                                       "linearly from `lr` to 0 over this many learned "
                                       "transitions (CleanRL's anneal_lr; set it to the run's "
                                       "env-step budget); null: constant")
