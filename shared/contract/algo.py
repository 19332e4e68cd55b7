"""The settings an algorithm's config is made of.

Every algorithm's config (in its own folder, `rlfleet/shared/algos/<name>/config.py`)
extends `AlgoConfig` and adds the named groups of settings it uses. The roles read those
settings by type, never by looking for a field: the coordinator sizes a group's rollouts by
`isinstance(cfg.algo, RolloutSettings)`, the learner computes n-step returns where
`isinstance(cfg.algo, NStepSettings)`, and so on.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from rlfleet.shared.contract.config import Frozen


class RewardModelConfig(Frozen):
    """A reward model: the learner rewrites every batch's rewards with it before the
    algorithm's loss, and trains it on the batch. Written as a mapping, or as the bare name
    or path when it takes no kwargs."""

    path: str = Field(pattern=r"^([A-Za-z_][\w.]*:[A-Za-z_][\w.]*|[a-z][a-z0-9_-]*)$",
                      description="a built-in reward model by name ('rnd': Random Network "
                      "Distillation), or the import path 'package.module:Class' of one")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="its settings: passed "
                                   "to the class as cls(env_spec, seed=seed, **kwargs)")


class AlgoConfig(Frozen):
    """What every algorithm has. `name` picks the algorithm (the registry's entry), and the
    config class with it."""

    name: str
    policy: str | None = Field(None, description="import path 'package.module:Class' of a "
                               "Policy to use instead of the built-in one (it reads these "
                               "settings)")
    reward_model: RewardModelConfig | None = Field(None, description="rewrite the rewards "
                                                   "the algorithm trains on (an intrinsic "
                                                   "bonus, a learned reward)")
    params: dict[str, Any] = Field(default_factory=dict, description="free-form settings for "
                                   "a user's own policy class")
    hidden_sizes: tuple[int, ...] = Field((128, 128), description="MLP widths")
    lr: float = Field(1e-3, gt=0, description="learning rate")
    gamma: float = Field(0.99, ge=0, le=1, description="discount factor")
    batch_size: int = Field(64, ge=1, le=65536, description="items per minibatch")
    max_grad_norm: float = Field(10.0, gt=0, description="gradients are clipped to this "
                                 "global L2 norm")

    @field_validator("reward_model", mode="before")
    @classmethod
    def _reward_model_path(cls, value: Any) -> Any:
        return {"path": value} if isinstance(value, str) else value


class EpsilonGreedySettings(Frozen):
    """Epsilon-greedy acting, epsilon decaying linearly over the run's global env steps."""

    eps_start: float = Field(1.0, ge=0, le=1, description="epsilon at env step 0")
    eps_end: float = Field(0.05, ge=0, le=1, description="epsilon after eps_decay_steps")
    eps_decay_steps: int = Field(10_000, ge=1, description="global env steps over which epsilon "
                                 "decays linearly")
    eval_epsilon: float = Field(0.05, ge=0, le=1, description="epsilon of the stochastic "
                                "evaluation")


class PrioritySettings(Frozen):
    """Priorities for a prioritized buffer, from the algorithm's |TD error|."""

    priority_eps: float = Field(1e-6, gt=0, description="added to |TD error| to make a "
                                "priority, so every item may be replayed again")


class NStepSettings(Frozen):
    """n-step returns, computed by the learner as it assembles a batch."""

    n_step: int = Field(1, ge=1, le=100, description="n-step returns: each sampled row's "
                        "target sums up to n discounted rewards of its run and bootstraps "
                        "with gamma^m from the m-th next observation (never across an "
                        "episode's end or a chunk's cut); computed by the learner at batch "
                        "assembly")


class HERConfig(Frozen):
    """Hindsight relabelling at sample time: k of every k + 1 sampled rows get as goal an
    achieved goal of their own run, and their reward (and termination) from the env's
    `compute_reward` (and `compute_terminated`); stored chunks stay as collected."""

    strategy: Literal["future", "final"] = Field("future", description="future: the goal "
                                                 "achieved after a uniformly drawn step from "
                                                 "this one to the run's end; final: the one "
                                                 "achieved at the run's end")
    k: int = Field(4, ge=1, le=64, description="relabelled rows per original one")


class HindsightSettings(Frozen):
    """Hindsight experience replay for goal-conditioned envs."""

    her: HERConfig | None = Field(None, description="hindsight experience replay for "
                                  "goal-conditioned envs (Dict observation, achieved_goal, "
                                  "desired_goal): sampled rows are relabelled by the learner")


class RolloutSettings(Frozen):
    """On-policy learning in rounds of whole chunks from a queue buffer."""

    rollout_size: int = Field(2048, ge=1, description="transitions per learn round: whole "
                              "chunks are gathered until at least this many")
    max_policy_lag: int | None = Field(3, ge=0, description="the learner drops chunks acted "
                                       "by a policy more than this many versions old")


class ObsNormSettings(Frozen):
    """Observations normalised by statistics the learner owns and publishes."""

    obs_norm: bool = Field(False, description="normalise observations by a running mean and "
                           "variance that the learner merges from every collector's counts "
                           "and publishes with the weights")
    obs_clip: float = Field(10.0, gt=0, description="obs_norm: clip normalised observations "
                            "to this many standard deviations")
