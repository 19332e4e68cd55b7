"""RND's settings: the kwargs of `algo.reward_model: {path: rnd, kwargs: {...}}`."""

from __future__ import annotations

from pydantic import Field

from rlfleet.shared.contract.config import Frozen


class RNDConfig(Frozen):
    """Random Network Distillation's exploration bonus: reward = extrinsic x env reward +
    scale x intrinsic / running std(intrinsic)."""

    scale: float = Field(1.0, ge=0, description="weight of the normalised intrinsic reward")
    extrinsic: float = Field(1.0, ge=0, description="weight of the env's own reward")
    hidden_sizes: tuple[int, ...] = Field((64, 64), description="MLP widths of the target "
                                          "and predictor networks (images: the Nature CNN)")
    embedding_size: int = Field(64, ge=1, description="width of the embedding the predictor "
                                "learns to reproduce")
    lr: float = Field(1e-3, gt=0, description="the predictor's learning rate")
    obs_clip: float = Field(5.0, gt=0, description="normalised observations are clipped to "
                            "this many standard deviations")
