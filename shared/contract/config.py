"""Run configuration: one frozen pydantic model per component, loaded from YAML.

Every role reads the same `RunConfig`: the coordinator loads it from a file and hands it to
each worker at registration, so a worker container needs nothing but the coordinator's URL.
Unknown keys are errors (a typo in a hyperparameter must not silently fall back to a default),
and every error names the dotted path of the offending field.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

# libyaml's parser and emitter when PyYAML has them: the same documents in and out, about
# seven times faster; every role and the launcher read the run's config as they start.
_FAST_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_FAST_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


class ConfigError(ValueError):
    """A config file that cannot be used; the message names the field and the file."""


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AtariConfig(_Frozen):
    """Gymnasium's standard Atari preprocessing (Machado et al. 2018): the defaults are the
    field's protocol, so results compare with published ones."""

    frame_skip: int = Field(4, ge=1, le=16, description="emulator frames per agent step "
                            "(max-pooled over the last two)")
    screen_size: int = Field(84, ge=16, le=256, description="square frame side after resizing")
    grayscale: bool = Field(True, description="one luminance channel instead of RGB")
    frame_stack: int = Field(4, ge=1, le=16, description="frames per observation")
    repeat_action_probability: float = Field(0.25, ge=0, le=1, description="sticky actions: "
                                             "the chance the previous action repeats")
    noop_max: int = Field(30, ge=0, description="up to this many no-ops after a reset")
    terminal_on_life_loss: bool = Field(False, description="end an episode at each life lost "
                                        "(an old trick; the protocol says no)")
    full_action_space: bool = Field(False, description="all 18 actions, not the game's own")
    max_episode_frames: int | None = Field(108_000, ge=1, description="emulator frames after "
                                           "which an episode is truncated (30 min of play)")


class EnvConfig(_Frozen):
    id: str = Field("CartPole-v1", description="gymnasium environment id")
    num_envs: int = Field(4, ge=1, le=1024, description="envs per collector's vector env")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="passed to gymnasium.make")
    frame_skip: int = Field(1, ge=1, description="env frames one env step stands for (a "
                            "frame-skip wrapper's k): counts frames in counters/frames")
    reward_weights: tuple[float, ...] | None = Field(None, description="vector-reward envs: "
                                                     "the reward is their dot product with "
                                                     "these weights; each component is logged")
    backend: Literal["sync", "async", "envpool"] = Field(
        "sync", description="sync: envs step in the collector's process; async: each in a "
        "subprocess (gymnasium AsyncVectorEnv), for slow envs; envpool: EnvPool's C++ "
        "threads step the batch (Atari and MuJoCo; needs the envpool extra)")
    atari: AtariConfig | None = Field(None, description="an ALE game (env.id such as "
                                      "ALE/Pong-v5) with the standard preprocessing; needs "
                                      "the atari extra")

    @model_validator(mode="after")
    def _atari_frames(self) -> EnvConfig:
        """With `atari`, one env step is `atari.frame_skip` emulator frames: counters in
        frames use that, and a contradicting `frame_skip` is an error rather than a guess."""
        if self.atari is None:
            return self
        if "frame_skip" in self.model_fields_set and self.frame_skip != self.atari.frame_skip:
            raise ValueError(f"frame_skip={self.frame_skip} contradicts atari.frame_skip="
                             f"{self.atari.frame_skip}; set only atari.frame_skip")
        object.__setattr__(self, "frame_skip", self.atari.frame_skip)
        return self


class RewardModelConfig(_Frozen):
    """A reward model (`shared/algos/reward_model.py`): the learner rewrites every batch's
    rewards with it before the algorithm's loss, and trains it on the batch. Written as a
    mapping, or as the bare import path when it takes no kwargs."""

    path: str = Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$", description="import "
                      "path 'package.module:Class'; built in: "
                      "'rlfleet.shared.algos.rnd:RND' (Random Network Distillation)")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="passed to the class as "
                                   "cls(env_spec, seed=seed, **kwargs)")


class _AlgoBase(_Frozen):
    policy: str | None = Field(None, description="import path 'package.module:Class' of a "
                               "Policy to use instead of the built-in one")
    reward_model: RewardModelConfig | None = Field(None, description="rewrite the rewards "
                                                   "the algorithm trains on (an intrinsic "
                                                   "bonus, a learned reward)")
    params: dict[str, Any] = Field(default_factory=dict, description="free-form settings for "
                                   "a user's own policy class")
    hidden_sizes: tuple[int, ...] = Field((128, 128), description="MLP widths")
    lr: float = Field(1e-3, gt=0)
    gamma: float = Field(0.99, ge=0, le=1)
    batch_size: int = Field(64, ge=1, le=65536, description="items per minibatch")
    max_grad_norm: float = Field(10.0, gt=0)

    @field_validator("reward_model", mode="before")
    @classmethod
    def _reward_model_path(cls, value: Any) -> Any:
        return {"path": value} if isinstance(value, str) else value


class HERConfig(_Frozen):
    """Hindsight relabelling at sample time: k of every k + 1 sampled rows get as goal an
    achieved goal of their own run, and their reward (and termination) from the env's
    `compute_reward` (and `compute_terminated`); stored chunks stay as collected."""

    strategy: Literal["future", "final"] = Field("future", description="future: the goal "
                                                 "achieved after a uniformly drawn step from "
                                                 "this one to the run's end; final: the one "
                                                 "achieved at the run's end")
    k: int = Field(4, ge=1, le=64, description="relabelled rows per original one")


class DQNConfig(_AlgoBase):
    name: Literal["dqn"] = "dqn"
    target_update_every: int = Field(250, ge=1, description="train iterations between hard "
                                     "target-network copies")
    eps_start: float = Field(1.0, ge=0, le=1)
    eps_end: float = Field(0.05, ge=0, le=1)
    eps_decay_steps: int = Field(10_000, ge=1, description="global env steps over which epsilon "
                                 "decays linearly")
    eval_epsilon: float = Field(0.05, ge=0, le=1, description="epsilon of the stochastic "
                                "evaluation")
    priority_eps: float = Field(1e-6, gt=0, description="added to |TD error| to make a "
                                "priority, so no item is never replayed again")
    n_step: int = Field(1, ge=1, le=100, description="n-step returns: each sampled row's "
                        "target sums up to n discounted rewards of its run and bootstraps "
                        "with gamma^m from the m-th next observation (never across an "
                        "episode's end or a chunk's cut); computed by the learner at batch "
                        "assembly")
    her: HERConfig | None = Field(None, description="hindsight experience replay for "
                                  "goal-conditioned envs (Dict observation, achieved_goal, "
                                  "desired_goal): sampled rows are relabelled by the learner")


class CQLConfig(DQNConfig):
    """Discrete CQL (Kumar et al. 2020): DQN's double-DQN target plus a conservative penalty,
    so Q-values of actions the dataset never took are pushed down rather than trusted."""

    name: Literal["cql"] = "cql"  # type: ignore[assignment]
    cql_alpha: float = Field(1.0, ge=0, description="weight of logsumexp_a Q(s, a) - "
                             "Q(s, a_data)")


class BCConfig(_AlgoBase):
    """Behaviour cloning: maximum likelihood of the dataset's actions (cross-entropy over
    discrete actions, squared error for continuous ones)."""

    name: Literal["bc"] = "bc"


class PPOConfig(_AlgoBase):
    name: Literal["ppo"] = "ppo"
    hidden_sizes: tuple[int, ...] = Field((64, 64), description="MLP widths of actor and critic")
    lr: float = Field(3e-4, gt=0)
    batch_size: int = Field(256, ge=1, le=65536, description="transitions per minibatch")
    max_grad_norm: float = Field(0.5, gt=0)
    rollout_size: int = Field(2048, ge=1, description="transitions per learn round: whole "
                              "chunks are gathered until at least this many")
    epochs: int = Field(4, ge=1, le=100, description="passes over each rollout")
    gae_lambda: float = Field(0.95, ge=0, le=1)
    clip_coef: float = Field(0.2, gt=0)
    clip_vloss: bool = Field(False, description="clip the value loss like the policy loss")
    vf_coef: float = Field(0.5, ge=0)
    ent_coef: float = Field(0.0, ge=0)
    norm_adv: bool = Field(True, description="normalise advantages per minibatch")
    reward_scale: float = Field(1.0, gt=0, description="rewards are multiplied by this before "
                                "GAE (returns are logged unscaled)")
    init_log_std: float = Field(0.0, description="continuous actions: initial log std")
    obs_norm: bool = Field(False, description="normalise observations by a running mean and "
                           "variance that the learner merges from every collector's counts "
                           "and publishes with the weights")
    obs_clip: float = Field(10.0, gt=0, description="obs_norm: clip normalised observations "
                            "to this many standard deviations")
    max_policy_lag: int | None = Field(3, ge=0, description="the learner drops chunks acted "
                                       "by a policy more than this many versions old")
    lr_anneal_rows: int | None = Field(None, ge=1, description="the learning rate falls "
                                       "linearly from `lr` to 0 over this many learned "
                                       "transitions (CleanRL's anneal_lr; set it to the run's "
                                       "env-step budget); null: constant")


AlgoConfig = Annotated[DQNConfig | CQLConfig | BCConfig | PPOConfig,
                       Field(discriminator="name")]
ALGO_NAMES = ("dqn", "cql", "bc", "ppo")


class CollectorConfig(_Frozen):
    mode: Literal["samples", "episodes"] = Field("samples", description="cut chunks by "
                                                 "transitions or by whole episodes")
    chunk_size: int = Field(256, ge=1, le=1_000_000, description="samples mode: transitions "
                            "per chunk")
    episodes_per_chunk: int = Field(4, ge=1, le=10_000, description="episodes mode: whole "
                                    "episodes per chunk")
    report_interval_s: float = Field(0.05, gt=0, description="how long chunk metadata may wait "
                                     "to be batched into one report")
    policy_check_interval_s: float = Field(0.02, ge=0, description="minimum time between two "
                                           "looks for a newer policy version")
    insert_into: tuple[str, ...] | None = Field(None, description="buffers that receive "
                                                "collected chunks; null: all of them")
    max_held_chunks: int = Field(64, ge=1, le=100_000, description="chunks a collector may "
                                 "have unacknowledged: kept in memory while storage cannot "
                                 "take them, or written while the coordinator cannot be "
                                 "told; collection waits while this many are")
    compression: Literal["auto", "none", "zstd", "lz4"] = Field(
        "auto", description="how chunks' large columns are compressed in storage; auto: zstd "
        "for chunks of stacked frames (tens of times smaller), none for the rest (small "
        "float columns gain too little for the time)")
    save_to: str | None = Field(None, description="a buffer saver: every whole episode "
                                "collected is also written to this directory (relative: to "
                                "the run directory), for `rlfleet export`")


class RateLimitConfig(_Frozen):
    """Reverb-style: sampling starts at `min_size` items and then holds sampled items near
    `samples_per_insert` x inserted items, within `error_buffer` items either way."""

    min_size: int = Field(1, ge=1, description="items held before the first sample")
    samples_per_insert: float | None = Field(
        None, gt=0, description="items sampled per item inserted (replay ratio x batch size "
        "per env step); null lets learners and collectors run free")
    error_buffer: float = Field(64_000, gt=0, description="how many items sampling may run "
                                "ahead of or behind the ratio before one side waits")
    min_lead: float | None = Field(
        None, description="inserts wait while sampling is less than this many items ahead of "
        "the ratio (negative: behind it); null: -error_buffer, a band symmetric about the "
        "ratio. Near error_buffer, learners stay at the top of the band, where a single "
        "process that trains between chunks runs; collectors then wait for the learner "
        "instead of running error_buffer behind it")


BufferKind = Literal["uniform", "prioritized", "episode", "queue", "dataset"]


class BufferConfig(_Frozen):
    kind: BufferKind = "uniform"
    capacity: int = Field(100_000, ge=1, description="transitions held; the oldest go first")
    # uniform
    replacement: bool = Field(True, description="uniform: may one request repeat an item")
    sample_range: int | None = Field(None, ge=1, description="uniform: sample only the "
                                     "newest N items")
    # prioritized
    alpha: float = Field(0.6, ge=0, description="prioritized: priority exponent")
    beta: float = Field(0.4, ge=0, le=1, description="prioritized: initial IS exponent")
    beta_final: float = Field(1.0, ge=0, le=1)
    beta_anneal_iterations: int = Field(100_000, ge=1, description="train iterations over "
                                        "which beta goes to beta_final")
    # episode
    sequence_length: int = Field(1, ge=1, description="episode: rows per sampled sequence")
    # queue
    max_policy_lag: int | None = Field(None, ge=0, description="queue: chunks acted by a "
                                       "policy older than this many versions are dropped")
    # dataset
    path: str | None = Field(None, description="dataset: a Minari dataset's directory (ours "
                             "from `rlfleet export`, or any Minari dataset)")
    minari_id: str | None = Field(None, description="dataset: a Minari dataset id, looked up "
                                  "under MINARI_DATASETS_PATH (default ~/.minari/datasets)")
    rate_limit: RateLimitConfig = RateLimitConfig()

    @model_validator(mode="after")
    def _dataset_source(self) -> BufferConfig:
        if self.kind == "dataset":
            if (self.path is None) == (self.minari_id is None):
                raise ValueError("a dataset buffer needs exactly one of path and minari_id")
            if self.rate_limit.samples_per_insert is not None:
                raise ValueError("rate_limit.samples_per_insert: a dataset buffer is read-only; "
                                 "nothing is inserted to balance samples against")
        elif self.path is not None or self.minari_id is not None:
            raise ValueError(f"path and minari_id are for kind: dataset, not {self.kind!r}")
        return self


class MixPart(_Frozen):
    buffer: str
    fraction: float = Field(gt=0, le=1)
    reward: float | None = Field(None, description="every row drawn from this buffer gets "
                                 "this reward (SQIL: expert 1, agent 0), set by the learner "
                                 "at batch assembly; null: the stored rewards")


def split_batch(batch_size: int, fractions: list[float]) -> list[int]:
    """Items per buffer of a mixed batch: largest remainder, so they add up to batch_size."""
    raw = [f * batch_size for f in fractions]
    sizes = [int(r) for r in raw]
    order = sorted(range(len(raw)), key=lambda i: raw[i] - sizes[i], reverse=True)
    for i in order[: batch_size - sum(sizes)]:
        sizes[i] += 1
    return sizes


class LearnerConfig(_Frozen):
    count: int = Field(1, ge=1, le=1024, description="learners training one policy as a "
                       "data-parallel group (`rlfleet up --learners N`); each takes "
                       "1/count of every batch")
    collective_timeout_s: float = Field(30.0, gt=0, le=3600, description="a learner group's "
                                        "rendezvous and all-reduces fail after this long, so "
                                        "a hung learner never hangs the group for good")
    group_port: int = Field(0, ge=0, le=65535, description="port of the TCPStore every "
                            "learner hosts for the group's rendezvous (0: any free port)")
    mix: tuple[MixPart, ...] = Field(
        (MixPart(buffer="replay", fraction=1.0),), description="one batch drawn from these "
        "buffers in these fractions (they must sum to 1)")
    by_buffer: dict[str, int] | None = Field(
        None, description="instead of mix: one batch per buffer, of this batch size")
    publish_every: int = Field(10, ge=1, description="train iterations between policy versions")
    publish_min_interval_s: float = Field(
        0.05, ge=0, le=3600, description="and at least this long between them: each "
        "version is a copy, a pipe message and an encode and write in the data process, so "
        "a small network at 1,400 updates/s publishing every 25 gave a sixth of a core to "
        "58 versions a second (0: every publish_every)")
    batches_per_request: int = Field(32, ge=1, le=1024, description="batches one sample "
                                     "request carries")
    prefetch_requests: int = Field(2, ge=1, le=64, description="sample responses held ready")
    data_process: bool = Field(True, description="sample, read and assemble batches in a "
                               "process of the learner's own, handing them over in shared "
                               "memory (false: on a thread of the learner's process)")
    chunk_cache: int = Field(4096, ge=1, description="chunks the learner keeps decoded")
    learn_info_interval_s: float = Field(0.1, gt=0)
    torch_threads: int = Field(1, ge=1, le=256, description="intra-op threads of the "
                               "training thread's torch calls: 1 leaves the other cores to "
                               "collectors; a conv net (Atari) whose collectors mostly wait "
                               "for it learns faster with 2 or more")


class DatasetEvalConfig(_Frozen):
    """The metric evaluator: the current policy against a held-out dataset."""

    path: str | None = Field(None, description="a Minari dataset's directory")
    minari_id: str | None = None
    metric: Literal["action_accuracy", "td_error", "return_prediction"] = Field(
        "action_accuracy", description="action_accuracy: share of steps whose greedy action is "
        "the dataset's; td_error: mean |r + gamma max_a' Q(s', a') - Q(s, a)|; "
        "return_prediction: mean |max_a Q(s, a) - discounted return from s|")
    every_train_iterations: int = Field(1000, ge=1)
    max_steps: int = Field(100_000, ge=1, description="steps of the dataset used (its first)")

    @model_validator(mode="after")
    def _one_source(self) -> DatasetEvalConfig:
        if (self.path is None) == (self.minari_id is None):
            raise ValueError("eval.dataset needs exactly one of path and minari_id")
        return self


class VideoConfig(_Frozen):
    """Videos of the evaluated policy (`eval.video`): the `video` extra must be installed."""

    every_evaluations: int = Field(1, ge=1, description="record every this many evaluations "
                                   "(the first one included)")
    fps: int = Field(30, ge=1, le=240)
    episodes: int = Field(1, ge=1, le=10, description="deterministic episodes per video")
    max_frames: int = Field(3000, ge=1, le=100_000, description="a video stops after this many "
                            "frames (an episode that never ends must not fill memory)")


class EvalConfig(_Frozen):
    every_env_steps: int | None = Field(5000, ge=1, description="evaluate every this many "
                                        "env steps")
    every_train_iterations: int | None = Field(None, ge=1, description="or every this many "
                                               "train iterations (whichever comes first)")
    start_env_steps: int = Field(0, ge=0, le=2**53 - 1, description="no evaluation before "
                                 "this many env steps (a lucky early policy cannot end the "
                                 "run before then)")
    stochastic: bool = Field(True, description="also run the same episodes with the "
                             "exploring policy, logged under eval/stochastic")
    episodes: int = Field(10, ge=1, le=1000)
    num_envs: int = Field(10, ge=1, le=1000, description="eval episodes run side by side")
    stop_value: float | None = Field(475.0, description="mean deterministic return that ends "
                                     "the run as solved")
    dataset: DatasetEvalConfig | None = Field(None, description="also score the policy on a "
                                              "dataset, as eval/dataset/<metric>")
    video: VideoConfig | None = Field(None, description="record the evaluated policy to MP4 "
                                      "(<run-dir>/videos/, TensorBoard, W&B)")


class StopConfig(_Frozen):
    max_env_steps: int | None = Field(None, ge=1)
    max_train_iterations: int | None = Field(None, ge=1, description="offline runs have no "
                                             "env steps to count")
    max_wall_s: float | None = Field(None, gt=0)


SCOPES = ("train", "collect", "eval", "update", "info")


class ScopeConfig(_Frozen):
    every_env_steps: int = Field(0, ge=0, description="write this scope at most once per this "
                                 "many env steps (0: every time it is logged)")
    arrays: Literal["drop", "minmeanmax"] = Field("drop", description="array values: left "
                                                  "out, or reduced to <key>_min/_mean/_max")


def _default_scopes() -> dict[str, ScopeConfig]:
    return {"train": ScopeConfig(every_env_steps=1000), "collect": ScopeConfig(
        every_env_steps=1000), "eval": ScopeConfig(), "update": ScopeConfig(
        every_env_steps=1000), "info": ScopeConfig(every_env_steps=5000)}


class WandbConfig(_Frozen):
    enabled: bool = False
    project: str = "rlfleet"
    entity: str | None = None
    mode: Literal["online", "offline"] = Field("offline", description="offline needs no "
                                               "network; `wandb sync` uploads later")


class LoggingConfig(_Frozen):
    """One logger per run, in the coordinator, fed by what workers report. Every record's
    step is the run's env step count, so all scopes share one x-axis."""

    scopes: dict[str, ScopeConfig] = Field(default_factory=_default_scopes, description="train,"
                                           " collect, eval, update, info: each its interval")
    tensorboard: bool = True
    jsonl: bool = True
    episodes: bool = Field(True, description="every finished episode as a row of "
                           "episodes.jsonl (about 0.3 KB a row: a run of short episodes left "
                           "for a week may want it off)")
    wandb: WandbConfig = WandbConfig()

    @model_validator(mode="after")
    def _known_scopes(self) -> LoggingConfig:
        for name in self.scopes:
            if name not in SCOPES:
                raise ValueError(f"logging.scopes: unknown scope {name!r}; scopes are "
                                 f"{', '.join(SCOPES)}")
        return self


class CheckpointConfig(_Frozen):
    every_train_iterations: int = Field(5000, ge=1, description="the learner saves its full "
                                        "state this often, and at the end")
    keep_last: int = Field(3, ge=1, description="checkpoints kept besides the best")
    prefix: str = Field("ckpt", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,31}$")
    metadata: dict[str, str] = Field(default_factory=dict, description="extra strings stored "
                                     "in every checkpoint")


class CoordinatorConfig(_Frozen):
    heartbeat_interval_s: float = Field(1.0, gt=0)
    heartbeat_timeout_s: float = Field(10.0, gt=0)
    task_push_timeout_s: float = Field(5.0, gt=0)
    snapshot_interval_s: float | None = Field(30.0, gt=0, description="how often buffers' "
                                              "indexes and counters are saved to storage")
    gc_interval_s: float = Field(10.0, gt=0, description="how often storage is scanned for "
                                 "chunks no buffer holds")
    orphan_grace_s: float = Field(60.0, gt=0, description="a chunk in storage that no buffer "
                                  "holds and nobody announced for this long is deleted (its "
                                  "collector died between writing and announcing it)")
    worker_networks: list[str] = Field(
        default_factory=list, max_length=64, description="CIDRs a worker's registered URL "
        "must resolve into (the coordinator POSTs tasks there); empty: any address. The "
        "compose file and deploy/k8s set their own networks")

    @field_validator("worker_networks")
    @classmethod
    def _networks_parse(cls, cidrs: list[str]) -> list[str]:
        import ipaddress

        for i, cidr in enumerate(cidrs):
            try:
                ipaddress.ip_network(cidr.strip(), strict=False)
            except ValueError:
                raise ValueError(f"worker_networks[{i}]={cidr!r} is not a CIDR such as "
                                 "10.0.0.0/8") from None
        return [c.strip() for c in cidrs]

    @model_validator(mode="after")
    def _timeout_exceeds_interval(self) -> CoordinatorConfig:
        if self.heartbeat_timeout_s <= self.heartbeat_interval_s:
            raise ValueError(f"heartbeat_timeout_s={self.heartbeat_timeout_s} must exceed "
                             f"heartbeat_interval_s={self.heartbeat_interval_s}")
        return self


BUILT_IN_BOTS = {"random": None, "perfect": ("tictactoe_v3",)}  # bot -> the games it plays


class WinRateRule(_Frozen):
    """A self-play stop condition on one evaluation's games against a bot."""

    opponent: str = Field(description="'bot-<bot>' (a bot of league.bots) or 'snapshot-first' "
                          "(the league's first snapshot, which it keeps)")
    seat: Literal["all", "first", "second"] = Field("all", description="games as first "
                                                    "player, as second, or all of them")
    min_win: float | None = Field(None, ge=0, le=1, description="win rate at least this")
    max_loss: float | None = Field(None, ge=0, le=1, description="loss rate at most this")

    @model_validator(mode="after")
    def _says_something(self) -> WinRateRule:
        if self.min_win is None and self.max_loss is None:
            raise ValueError("league.stop_when: a rule needs min_win or max_loss")
        return self


class LeagueConfig(_Frozen):
    """Self-play: `env.id` is a two-player game and the main player meets a league of its
    past snapshots and fixed bots (`coordinator/league.py`)."""

    bots: tuple[str, ...] = Field(("random",), description="fixed opponents: 'random', "
                                  "'perfect' (tictactoe_v3), or 'package.module:make_bot'")
    snapshot_every_versions: int = Field(100, ge=1, description="a snapshot of the main "
                                         "player joins the league every K policy versions")
    snapshot_win_rate: float = Field(0.7, gt=0, le=1, description="...or once it wins this "
                                     "share of its games against the newest snapshot")
    snapshot_min_games: int = Field(50, ge=1, description="games against the newest snapshot "
                                    "before its win rate counts")
    max_snapshots: int = Field(20, ge=2, description="the oldest snapshots leave beyond this "
                               "(the first one stays)")
    self_play_fraction: float = Field(0.2, ge=0, le=1, description="share of games against "
                                      "itself; the rest by PFSP")
    weighting: Literal["hard", "variance", "linear", "uniform"] = Field(
        "hard", description="PFSP weighting of the main player's win rate p: hard (1-p)^power, "
        "variance p(1-p), linear 1-p, uniform")
    power: float = Field(2.0, gt=0, description="the exponent of the hard weighting")
    eval_snapshots: int = Field(2, ge=0, le=16, description="evaluations also play the "
                                "newest this many snapshots (besides every bot and the first "
                                "snapshot)")
    stop_when: tuple[WinRateRule, ...] = Field((), description="the run is solved once one "
                                               "evaluation meets every rule")


class RunConfig(_Frozen):
    name: str = Field("run", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    seed: int = 0
    env: EnvConfig = EnvConfig()
    algo: AlgoConfig = DQNConfig()
    collector: CollectorConfig = CollectorConfig()
    buffers: dict[str, BufferConfig] = Field(
        default_factory=lambda: {"replay": BufferConfig()},
        description="named replay buffers; every chunk goes into each of "
        "collector.insert_into (default: all)")
    learner: LearnerConfig = LearnerConfig()
    eval: EvalConfig = EvalConfig()
    stop: StopConfig = StopConfig()
    coordinator: CoordinatorConfig = CoordinatorConfig()
    logging: LoggingConfig = LoggingConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    league: LeagueConfig | None = Field(None, description="self-play on a two-player game "
                                        "(absent: a single-agent gymnasium env)")
    storage: str | None = Field(None, description="directory path or redis://host:port/db; "
                                "default: <run-dir>/storage")

    @model_validator(mode="after")
    def _buffers_exist(self) -> RunConfig:
        if not self.buffers:
            raise ValueError("buffers: at least one buffer is needed")
        names = set(self.buffers)
        for name in self.buffers:
            if not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", name):
                raise ValueError(f"buffers: name {name!r} must be letters, digits, _ . -")
        for part in self.learner.mix:
            if part.buffer not in names:
                raise ValueError(f"learner.mix names buffer {part.buffer!r}, not one of "
                                 f"{sorted(names)}")
        for part in self.learner.mix:
            share = max(1, round(part.fraction * self.algo.batch_size))
            bcfg = self.buffers[part.buffer]
            items = share * (bcfg.sequence_length if bcfg.kind == "episode" else 1)
            limit = bcfg.rate_limit
            if limit.samples_per_insert is not None and limit.error_buffer < items:
                raise ValueError(
                    f"buffers.{part.buffer}.rate_limit.error_buffer="
                    f"{limit.error_buffer} is smaller than the {items} items of one "
                    "batch: learners and collectors would wait for each other forever")
            if limit.samples_per_insert is not None and limit.min_lead is not None and \
                    limit.min_lead > limit.error_buffer - items:
                raise ValueError(
                    f"buffers.{part.buffer}.rate_limit.min_lead={limit.min_lead} leaves less "
                    f"than the {items} items of one batch below error_buffer="
                    f"{limit.error_buffer}: learners and collectors would wait for each other "
                    "forever")
        queues = [p.buffer for p in self.learner.mix if self.buffers[p.buffer].kind == "queue"]
        if self.algo.name == "ppo" and self.algo.policy is None and (
                len(self.learner.mix) != 1 or not queues):
            raise ValueError("learner.mix: PPO learns from whole chunks of exactly one queue "
                             "buffer (buffers.<name>.kind: queue)")
        if queues and len(self.learner.mix) > 1:
            raise ValueError(f"learner.mix: queue buffer {queues[0]!r} hands out whole chunks "
                             "and cannot be mixed with other buffers")
        if self.algo.name in ("dqn", "cql") and self.algo.policy is None and queues:
            raise ValueError(f"learner.mix: DQN samples transitions; queue buffer "
                             f"{queues[0]!r} is for on-policy algorithms")
        if self.eval.every_env_steps is None and self.eval.every_train_iterations is None:
            raise ValueError("eval: set every_env_steps or every_train_iterations")
        total = sum(p.fraction for p in self.learner.mix)
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"learner.mix fractions sum to {total}, not 1")
        for name in self.learner.by_buffer or {}:
            if name not in names:
                raise ValueError(f"learner.by_buffer names buffer {name!r}, not one of "
                                 f"{sorted(names)}")
        for name in self.collector.insert_into or ():
            if name not in names:
                raise ValueError(f"collector.insert_into names buffer {name!r}, not one of "
                                 f"{sorted(names)}")
            if self.buffers[name].kind == "dataset":
                raise ValueError(f"collector.insert_into names buffer {name!r}, a read-only "
                                 "dataset buffer")
        if self.collector.save_to is not None and getattr(self.algo, "obs_norm", False):
            raise ValueError("collector.save_to: with algo.obs_norm chunks hold normalised "
                             "observations, which are no dataset of the env")
        if self.algo.name == "bc" and self.algo.policy is None and any(
                self.buffers[p.buffer].kind == "queue" for p in self.learner.mix):
            raise ValueError("learner.mix: behaviour cloning samples transitions, not a queue")
        problem = self.group_problem(self.learner.count)
        if problem:
            raise ValueError(f"learner.count={self.learner.count}: {problem}")
        if self.league is not None:
            self._check_league(self.league)
        return self

    @property
    def receiving_buffers(self) -> tuple[str, ...]:
        """The buffers collected chunks go into: `collector.insert_into`, or every buffer
        that is not a read-only dataset."""
        if self.collector.insert_into is not None:
            return self.collector.insert_into
        return tuple(n for n, b in self.buffers.items() if b.kind != "dataset")

    def _check_league(self, league: LeagueConfig) -> None:
        """What can be checked without importing the game (`check_run_config` builds it)."""
        if self.env.id not in ("tictactoe_v3", "connect_four_v3") and ":" not in self.env.id:
            raise ValueError(f"env.id={self.env.id!r}: a league plays a two-player game: "
                             "'tictactoe_v3', 'connect_four_v3' or 'package.module:make_env' "
                             "(a PettingZoo AEC env)")
        for bot in league.bots:
            if bot in BUILT_IN_BOTS:
                games = BUILT_IN_BOTS[bot]
                if games is not None and self.env.id not in games:
                    raise ValueError(f"league.bots: {bot!r} plays only {list(games)}, not "
                                     f"{self.env.id!r}")
            elif ":" not in bot:
                raise ValueError(f"league.bots: {bot!r} is not a bot: use one of "
                                 f"{sorted(BUILT_IN_BOTS)} or 'package.module:make_bot'")
        if len(set(league.bots)) != len(league.bots):
            raise ValueError("league.bots: each bot once")
        names = [f"bot-{bot}" for bot in league.bots] + ["snapshot-first"]
        for rule in league.stop_when:
            if rule.opponent not in names:
                raise ValueError(f"league.stop_when: opponent {rule.opponent!r} is not one of "
                                 f"{names}")

    def group_problem(self, learners: int) -> str | None:
        """Why a learner group of this size cannot split this config's work, or None."""
        if learners <= 1:
            return None
        if getattr(self.algo, "obs_norm", False):
            return ("algo.obs_norm: each rank would merge only its own chunks' observation "
                    "counts, so the ranks' statistics would part; use one learner")
        if self.algo.name == "ppo" or any(self.buffers[p.buffer].kind == "queue"
                                          for p in self.learner.mix):
            rollout = int(getattr(self.algo, "rollout_size", self.algo.batch_size))
            if rollout < learners:
                return (f"algo.rollout_size={rollout} is smaller than the group: every "
                        "learner needs a share of each rollout")
            return None
        if self.learner.by_buffer is not None:
            for name, size in self.learner.by_buffer.items():
                if size % learners:
                    return (f"learner.by_buffer.{name}={size} is not divisible by the "
                            f"{learners} learners")
            return None
        sizes = split_batch(self.algo.batch_size, [p.fraction for p in self.learner.mix])
        if self.algo.batch_size % learners:
            return (f"algo.batch_size={self.algo.batch_size} is not divisible by the "
                    f"{learners} learners: the global batch is split evenly among them")
        for part, size in zip(self.learner.mix, sizes, strict=True):
            if size % learners:
                return (f"learner.mix share of buffer {part.buffer!r} is {size} items per "
                        f"batch, not divisible by the {learners} learners")
        return None

    def with_overrides(self, **changes: Any) -> RunConfig:
        """A copy with top-level fields replaced, validated like a file would be."""
        data = self.model_dump()
        data.update({k: v for k, v in changes.items() if v is not None})
        return parse_config(data, "overrides")


def format_validation_error(err: ValidationError, source: str = "config") -> str:
    """One line per problem, each naming the dotted field path."""
    lines = []
    for e in err.errors():
        parts = [str(p) for p in e["loc"]]
        # A tagged union puts the tag in the path (algo.dqn.lr): users wrote algo.lr.
        if len(parts) > 1 and parts[0] == "algo" and parts[1] in ALGO_NAMES:
            del parts[1]
        msg = e["msg"]
        if not parts:  # a check across fields: its message starts with the field it blames
            msg = msg.removeprefix("Value error, ")
            named = re.match(r"^([a-z_]+(?:\.[A-Za-z0-9_-]+)*)[=:\s]", msg)
            if named:
                parts = [named.group(1)]
        loc = ".".join(parts) or "(root)"
        lines.append(f"{source}: field '{loc}': {msg}")
    return "\n".join(lines)


def parse_config(data: Any, source: str = "config") -> RunConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level, got "
                          f"{type(data).__name__}")
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, source)) from None


def packaged_configs() -> list[str]:
    """The names of the ready runs shipped inside the package (`rlfleet.configs`)."""
    from importlib.resources import files

    return sorted(p.name.removesuffix(".yaml") for p in files("rlfleet.configs").iterdir()
                  if p.name.endswith(".yaml"))


def config_path(name_or_path: str | Path) -> Path:
    """A config file: the path itself when it exists, else the packaged ready run of that
    name (`cartpole-dqn` or `cartpole-dqn.yaml`), so `rlfleet up --config cartpole-dqn` works
    from any directory. A name that is neither is returned as given: reading it fails with
    the path in the message."""
    path = Path(name_or_path)
    if path.exists() or len(path.parts) != 1:
        return path
    from importlib.resources import as_file, files

    packaged = files("rlfleet.configs") / (path.name if path.suffix in (".yaml", ".yml")
                                           else f"{path.name}.yaml")
    if packaged.is_file():
        with as_file(packaged) as real:  # a zipped install would give a temporary copy
            return Path(real)
    return path


def load_config(path: str | Path) -> RunConfig:
    """The run config in a YAML file, or in the packaged ready run of that name."""
    given = path
    path = config_path(path)
    try:
        text = path.read_text()
    except OSError as err:
        known = ", ".join(packaged_configs()) if len(Path(given).parts) == 1 else ""
        raise ConfigError(f"cannot read config file {path}: {err.strerror}"
                          + (f" (and no packaged config is named so; there are: {known})"
                             if known else "")) from None
    try:
        data = yaml.load(text, Loader=_FAST_LOADER) or {}
    except yaml.YAMLError:  # again with the pure-Python parser: its message shows the line
        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as err:
            raise ConfigError(f"{path}: not valid YAML: {err}") from None
    return parse_config(data, str(path))


def dump_config(data: dict[str, Any]) -> str:
    """YAML text of a config's data, in the order given, as `yaml.safe_dump` writes it."""
    return yaml.dump(data, Dumper=_FAST_DUMPER, sort_keys=False)
