"""The sections of a run's config: one frozen pydantic model per component.

`rlfleet.shared.run.config.RunConfig` assembles them with the algorithm's own config (from
the algorithm registry). Unknown keys are errors (a typo in a hyperparameter must not
silently fall back to a default), and every error names the dotted path of the offending
field. Every field's description is the config reference (the site's
`reference/config.md`, generated from them by `docs/hooks.py`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator


class ConfigError(ValueError):
    """A config file that cannot be used; the message names the field and the file."""


class Frozen(BaseModel):
    """A config section: unknown keys are errors, and a loaded config never changes."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class AtariConfig(Frozen):
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
                                        "(not part of the protocol)")
    full_action_space: bool = Field(False, description="all 18 actions, not the game's own")
    max_episode_frames: int | None = Field(108_000, ge=1, description="emulator frames after "
                                           "which an episode is truncated (30 min of play)")


class EnvConfig(Frozen):
    """The environment every collector steps, as a vector env of `num_envs`."""

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


DEVICE_PATTERN = r"^(auto|cpu|cuda(:[0-9]{1,2})?)$"


def cuda_devices_needed(device: str) -> int:
    """The CUDA devices a `DEVICE_PATTERN` setting needs on its worker's machine: 0 for
    auto and cpu, 1 for cuda, N+1 for cuda:N (the launch check and the coordinator's
    registration check apply this one rule)."""
    if not device.startswith("cuda"):
        return 0
    return int(device.partition(":")[2] or 0) + 1


class CollectorConfig(Frozen):
    """How collectors cut experience into chunks and hand them over."""

    device: str = Field("cpu", pattern=DEVICE_PATTERN, description="where a collector's "
                        "policy acts: cpu, cuda, cuda:N, or auto (CUDA when the collector's "
                        "machine has it); acting on a small batch is usually faster on the "
                        "CPU, a conv net over many envs may act faster on a GPU")

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
    epsilon_schedule: Literal["linear", "apex"] = Field(
        "linear", description="how epsilon-greedy collectors explore: linear: the "
        "algorithm's eps_start to eps_end decay over the run's env steps; apex: Ape-X "
        "(Horgan et al. 2018), the collector in slot i of apex_slots acts with the fixed "
        "epsilon apex_eps ** (1 + apex_alpha * i / (apex_slots - 1)) (apex_eps when "
        "apex_slots is 1), a joining collector taking the lowest free slot with its collect "
        "task. Evaluations act as before")
    apex_slots: int = Field(8, ge=1, le=100_000, description="apex: N, the most collectors "
                            "the run expects; more than N share slots, each extra one taking "
                            "the slot fewest collectors hold (the lowest of those)")
    apex_eps: float = Field(0.4, gt=0, le=1, description="apex: the epsilon of slot 0, the "
                            "most exploring collector (the paper's 0.4)")
    apex_alpha: float = Field(7.0, ge=0, description="apex: how fast epsilon falls across "
                              "the slots: slot N-1 acts with apex_eps ** (1 + apex_alpha) "
                              "(the paper's 7)")


def apex_epsilon(slot: int, slots: int, eps: float = 0.4, alpha: float = 7.0) -> float:
    """Ape-X's fixed epsilon of the collector in `slot` (0-based) of `slots`:
    `eps ** (1 + alpha * slot / (slots - 1))`, and `eps` when there is one slot."""
    if slots < 1 or not 0 <= slot < slots:
        raise ValueError(f"slot {slot} is not one of {slots} slots")
    if slots == 1:
        return eps
    return eps ** (1 + alpha * slot / (slots - 1))


class RateLimitConfig(Frozen):
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


BufferKind = Literal["uniform", "prioritized", "episode", "sequence", "queue", "dataset"]


class BufferConfig(Frozen):
    """One named replay buffer of the coordinator's: an index of chunks in storage."""

    kind: BufferKind = Field("uniform", description="uniform: transitions sampled uniformly; "
                             "prioritized: proportional PER; episode: sequences inside one "
                             "episode; sequence: fixed-length, overlapping sequences inside "
                             "one episode, padded and prioritized (R2D2); queue: whole "
                             "chunks, each handed out once (on-policy); "
                             "dataset: a read-only Minari dataset")
    capacity: int = Field(100_000, ge=1, description="transitions held; the oldest go first")
    # uniform
    replacement: bool = Field(True, description="uniform: may one request repeat an item")
    sample_range: int | None = Field(None, ge=1, description="uniform: sample only the "
                                     "newest N items")
    # prioritized, sequence
    alpha: float = Field(0.6, ge=0, description="prioritized, sequence: priority exponent")
    beta: float = Field(0.4, ge=0, le=1, description="prioritized, sequence: initial IS "
                        "exponent")
    beta_final: float = Field(1.0, ge=0, le=1, description="prioritized, sequence: the IS "
                              "exponent after beta_anneal_iterations")
    beta_anneal_iterations: int = Field(100_000, ge=1, description="prioritized, sequence: "
                                        "train iterations over which beta goes to beta_final")
    # episode, sequence
    sequence_length: int = Field(1, ge=1, description="episode, sequence: rows per sampled "
                                 "sequence (R2D2: 80)")
    sequence_overlap: int = Field(0, ge=0, description="sequence: rows shared by consecutive "
                                  "sequences of a segment (R2D2: 40 of 80); less than "
                                  "sequence_length")
    # queue
    max_policy_lag: int | None = Field(None, ge=0, description="queue: chunks acted by a "
                                       "policy older than this many versions are dropped")
    # dataset
    path: str | None = Field(None, description="dataset: a Minari dataset's directory (ours "
                             "from `rlfleet export`, or any Minari dataset)")
    minari_id: str | None = Field(None, description="dataset: a Minari dataset id, looked up "
                                  "under MINARI_DATASETS_PATH (default ~/.minari/datasets)")
    rate_limit: RateLimitConfig = RateLimitConfig()

    @field_validator("sequence_overlap")
    @classmethod
    def _overlap_below_length(cls, value: int, info: ValidationInfo) -> int:
        """A field check (not a model one), so the error names
        `buffers.<name>.sequence_overlap` itself."""
        length = info.data.get("sequence_length")
        if length is not None and value >= length:
            raise ValueError(f"sequence_overlap={value} must be less than sequence_length="
                             f"{length}: consecutive sequences must start on different rows")
        return value

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


class MixPart(Frozen):
    """A share of every batch, drawn from one buffer."""

    buffer: str = Field(description="the buffer's name (a key of buffers)")
    fraction: float = Field(gt=0, le=1, description="its share of each batch (the shares sum "
                            "to 1)")
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


ImportPathStr = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_.]*$",
                                     max_length=256)]


class PluginConfig(Frozen):
    """A user's class named by import path ('package.module:Class'), made with `params`."""

    path: ImportPathStr = Field(description="'package.module:Class', importable on the "
                                "worker that runs it")
    params: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of "
                                   "its constructor")

    @model_validator(mode="before")
    @classmethod
    def _from_path(cls, value: Any) -> Any:
        return {"path": value} if isinstance(value, str) else value


class HookConfig(PluginConfig):
    """A learner hook (`rlfleet.learner.hooks.LearnerHook`)."""

    priority: int = Field(0, ge=-1000, le=1000, description="hooks run by priority, lowest "
                          "first; equal ones in the order listed")


class LearnerConfig(Frozen):
    """How learners are fed and how often they publish, report and checkpoint."""

    hooks: list[HookConfig] = Field(default_factory=list, max_length=32, description="the "
                                    "user's code at named stages of the learner's loop "
                                    "(before_run, before_iter, after_iter, after_run): "
                                    "docs/hooks.md")

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
    by_buffer: None = Field(None, exclude=True, description="not supported: the learner "
                            "trains on one batch per update (`mix` draws it from several "
                            "buffers). Accepted only as null, which configs saved by earlier "
                            "versions hold")
    publish_every: int = Field(10, ge=1, description="train iterations between policy versions")
    publish_min_interval_s: float = Field(
        0.05, ge=0, le=3600, description="and at least this long between them: each "
        "version costs a copy, a pipe message and an encode and write in the data process, "
        "so a small network updating a thousand times a second must not publish every few "
        "updates (0: every publish_every)")
    batches_per_request: int = Field(32, ge=1, le=1024, description="batches one sample "
                                     "request carries")
    prefetch_requests: int = Field(2, ge=1, le=64, description="sample responses held ready")
    data_process: bool = Field(True, description="sample, read and assemble batches in a "
                               "process of the learner's own, handing them over in shared "
                               "memory (false: on a thread of the learner's process)")
    chunk_cache: int = Field(4096, ge=1, description="chunks the learner keeps decoded")
    learn_info_interval_s: float = Field(0.1, gt=0, description="how often the learner "
                                         "reports its metrics, priorities and progress")
    data_shortage_warn_s: float = Field(60.0, gt=0, description="a learner that has waited "
                                        "this long for data says so: a warning in its log, "
                                        "an alert in `rlfleet status`, the dashboard and "
                                        "summary.json")
    torch_threads: int = Field(1, ge=1, le=256, description="intra-op threads of the "
                               "training thread's torch calls: 1 leaves the other cores to "
                               "collectors; a conv net (Atari) whose collectors mostly wait "
                               "for it learns faster with 2 or more")
    device: str = Field("auto", pattern=DEVICE_PATTERN, description="where the learner "
                        "trains: auto (CUDA when the learner's machine has it, else cpu), "
                        "cpu, cuda (a learner group puts rank i on its local GPU i), or "
                        "cuda:N. A config asking for CUDA is refused where there is none: by "
                        "`rlfleet up` on this machine, at registration for a remote learner")
    precision: Literal["fp32", "bf16", "fp16"] = Field(
        "fp32", description="the learner's arithmetic: bf16 or fp16 run the forward and "
        "backward passes under autocast (fp16 with a gradient scaler); weights, optimizer "
        "state, checkpoints and published versions stay fp32")
    pin_memory: bool = Field(True, description="on a GPU learner: copy batches through "
                             "pinned host buffers on a side stream, one batch ahead of the "
                             "update (false: plain blocking copies)")


    @field_validator("by_buffer", mode="before")
    @classmethod
    def _no_by_buffer(cls, value: Any) -> None:
        if value is not None:
            raise ValueError("one batch per buffer is not supported: the learner trains on "
                             "one batch per update; draw it from several buffers with "
                             "learner.mix")
        return None


class DatasetEvalConfig(Frozen):
    """The metric evaluator: the current policy against a held-out dataset."""

    path: str | None = Field(None, description="a Minari dataset's directory")
    minari_id: str | None = Field(None, description="a Minari dataset id, looked up under "
                                  "MINARI_DATASETS_PATH (default ~/.minari/datasets)")
    metric: Literal["action_accuracy", "td_error", "return_prediction"] = Field(
        "action_accuracy", description="action_accuracy: share of steps whose greedy action is "
        "the dataset's; td_error: mean |r + gamma max_a' Q(s', a') - Q(s, a)|; "
        "return_prediction: mean |max_a Q(s, a) - discounted return from s|")
    every_train_iterations: int = Field(1000, ge=1, description="score the policy every "
                                        "this many train iterations")
    max_steps: int = Field(100_000, ge=1, description="steps of the dataset used (its first)")

    @model_validator(mode="after")
    def _one_source(self) -> DatasetEvalConfig:
        if (self.path is None) == (self.minari_id is None):
            raise ValueError("eval.dataset needs exactly one of path and minari_id")
        return self


InfoKey = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$",
                                max_length=128)]


class VideoConfig(Frozen):
    """Videos of the evaluated policy (`eval.video`): the `video` extra must be installed."""

    every_evaluations: int = Field(1, ge=1, description="record every this many evaluations "
                                   "(the first one included)")
    fps: int = Field(30, ge=1, le=240, description="frames per second of the video")
    episodes: int = Field(1, ge=1, le=10, description="deterministic episodes per video")
    max_frames: int = Field(3000, ge=1, le=100_000, description="a video stops after this many "
                            "frames (an episode that never ends must not fill memory)")
    render_kwargs: dict[str, Any] = Field(default_factory=dict, description="keyword "
                                          "arguments for the video's env only, on top of "
                                          "env.kwargs (MuJoCo's width, height, camera_name)")


class EvalConfig(Frozen):
    """Evaluations: episodes on a collector's own envs, greedy and then exploring; a greedy
    mean at `stop_value` ends the run as solved."""

    every_env_steps: int | None = Field(5000, ge=1, description="evaluate every this many "
                                        "env steps")
    every_train_iterations: int | None = Field(None, ge=1, description="or every this many "
                                               "train iterations (whichever comes first)")
    start_env_steps: int = Field(0, ge=0, le=2**53 - 1, description="no evaluation before "
                                 "this many env steps (a lucky early policy cannot end the "
                                 "run before then)")
    stochastic: bool = Field(True, description="also run the same episodes with the "
                             "exploring policy, logged under eval/stochastic")
    episodes: int = Field(10, ge=1, le=1000, description="episodes per evaluation (and as "
                          "many again with the exploring policy when stochastic)")
    num_envs: int = Field(10, ge=1, le=1000, description="eval episodes run side by side")
    max_steps: int | None = Field(
        100_000, ge=1, description="env steps after which an evaluation episode is cut and "
        "counted as truncated (eval/<mode>/truncated), so that an env without a time limit "
        "or a policy that never ends an episode cannot hold a collector's loop for good; the "
        "env's own time limit still ends episodes sooner. The default lies far beyond the "
        "limits of gymnasium's envs (CartPole 500, MuJoCo 1000, Atari 27,000 agent steps); "
        "null: no cap, episodes end only as the env ends them")
    info_keys: list[InfoKey] = Field(default_factory=list, max_length=32, description="numbers "
                                     "the env reports in its info at an episode's last step "
                                     "(dotted paths into nested dicts): their means over the "
                                     "evaluation's episodes are reported and logged as "
                                     "eval/<mode>/info/<key>")
    episode_return_key: InfoKey | None = Field(None, description="an episode's return is what "
                                               "its last step's info says there (`episode.r` "
                                               "under RecordEpisodeStatistics): the true "
                                               "score under clipped or shaped rewards; the sum "
                                               "of rewards where the info has none")
    stop_value: float | None = Field(475.0, description="mean deterministic return that ends "
                                     "the run as solved")
    dataset: DatasetEvalConfig | None = Field(None, description="also score the policy on a "
                                              "dataset, as eval/dataset/<metric>")
    video: VideoConfig | None = Field(None, description="record the evaluated policy to MP4 "
                                      "(<run-dir>/videos/, TensorBoard, W&B)")


class StopConfig(Frozen):
    """When a run ends besides being solved (`eval.stop_value`): whichever comes first."""

    max_env_steps: int | None = Field(None, ge=1, description="env steps of all collectors "
                                      "together")
    max_train_iterations: int | None = Field(None, ge=1, description="offline runs have no "
                                             "env steps to count")
    max_wall_s: float | None = Field(None, gt=0, description="seconds since the run began "
                                     "(a resumed run counts from where it stopped)")


SCOPES = ("train", "collect", "eval", "update", "info")


class ScopeConfig(Frozen):
    """How often one logging scope is written, and what becomes of array values."""

    every_env_steps: int = Field(0, ge=0, description="write this scope at most once per this "
                                 "many env steps (0: every time it is logged)")
    arrays: Literal["drop", "minmeanmax"] = Field("drop", description="array values: left "
                                                  "out, or reduced to <key>_min/_mean/_max")
    every_train_iterations: int = Field(0, ge=0, description="train scope only: write it "
                                        "once per this many train iterations instead of by "
                                        "env steps (0: by every_env_steps)")
    min_max: bool = Field(False, description="train scope only: besides each metric's mean "
                          "over the interval, <key>_min and <key>_max")


def _default_scopes() -> dict[str, ScopeConfig]:
    return {"train": ScopeConfig(every_env_steps=1000), "collect": ScopeConfig(
        every_env_steps=1000), "eval": ScopeConfig(), "update": ScopeConfig(
        every_env_steps=1000), "info": ScopeConfig(every_env_steps=5000)}


class WandbConfig(Frozen):
    """Weights & Biases (the `wandb` extra); a missing or broken wandb logs one warning and
    never fails the run."""

    enabled: bool = Field(False, description="log the run's scalars to W&B too")
    project: str = Field("rlfleet", description="the W&B project")
    entity: str | None = Field(None, description="the W&B entity (team or user); null: "
                               "wandb's default")
    mode: Literal["online", "offline"] = Field("offline", description="offline needs no "
                                               "network; `wandb sync` uploads later")


class HistogramConfig(Frozen):
    """Histograms of the learner's networks and data (`logging.histograms`), to TensorBoard
    and W&B: what DI-engine's gradient and action loggers show."""

    every_train_iterations: int = Field(1000, ge=1, description="take them once per this "
                                        "many train iterations (on the group's publisher)")
    bins: int = Field(30, ge=2, le=256, description="buckets per histogram")
    weights: bool = Field(True, description="each trainable parameter's values")
    gradients: bool = Field(True, description="each trainable parameter's gradient of the "
                            "update just made")
    actions: bool = Field(True, description="the actions of the update's batch")
    q_values: bool = Field(True, description="Q(s, .) on the batch's observations, for "
                           "policies that give them (DQN and its kin)")


class BatchLogConfig(Frozen):
    """MRL's batch log (`logging.batch_log`): which replay items the learner trained on, how
    often each, and per-sample values logged during learning (docs/batch-log.md)."""

    every_train_iterations: int = Field(100, ge=1, description="log the samples of one "
                                        "update in this many, with their per-sample values "
                                        "(on every rank)")
    samples_per_update: int = Field(256, ge=1, le=65_536, description="at most this many "
                                    "samples of a logged update (its batch's first: batches "
                                    "are drawn at random)")
    unique_in_memory: int = Field(262_144, ge=1024, le=1 << 26, description="per buffer, how "
                                  "many items' sample counts the coordinator holds between "
                                  "flushes (32 bytes each); an item pushed out goes to disk")
    flush_s: float = Field(30.0, gt=0, description="sample counts go to samples.jsonl at "
                           "least this often (and when the run ends)")
    max_mb: float | None = Field(256.0, gt=0, description="each table's size limit in MB "
                                 "(batch_log.jsonl, samples.jsonl), rotated like the episode "
                                 "table; null: no limit")


class LoggingConfig(Frozen):
    """One logger per run, in the coordinator, fed by what workers report. Every record's
    step is the run's env step count, so all scopes share one x-axis."""

    scopes: dict[str, ScopeConfig] = Field(default_factory=_default_scopes, description="train,"
                                           " collect, eval, update, info: each its interval")
    tensorboard: bool = Field(True, description="TensorBoard event files in <run-dir>/tb/")
    jsonl: bool = Field(True, description="every record as a line of <run-dir>/metrics.jsonl")
    episodes: bool = Field(True, description="every finished episode as a row of "
                           "episodes.jsonl (about 0.3 KB a row, within episodes_max_mb)")
    episodes_max_mb: float | None = Field(
        256.0, gt=0, description="the episode table's size limit in MB (10^6 bytes), rotated "
        "files included: episodes.jsonl rotates into episodes-<UTC time>.jsonl at an eighth "
        "of it, and the oldest rotated files are deleted while the table would pass it, so a "
        "long run keeps its newest episodes (256 MB: about 850,000 rows); null: no limit, one "
        "file that only grows")
    wandb: WandbConfig = WandbConfig()
    histograms: HistogramConfig | None = Field(None, description="histograms of weights, "
                                               "gradients, actions and Q-values at an "
                                               "interval (null: none)")
    batch_log: BatchLogConfig | None = Field(None, description="the batch log: samples "
                                             "trained on and per-sample values (null: off)")
    writers: list[PluginConfig] = Field(default_factory=list, max_length=16, description="more "
                                        "destinations of every record: a user's class, or "
                                        "rlfleet's MLflow writer "
                                        "(rlfleet.shared.telemetry.mlflow_writer:MLflowWriter, "
                                        "the `mlflow` extra): docs/hooks.md")

    @model_validator(mode="after")
    def _known_scopes(self) -> LoggingConfig:
        for name, scope in self.scopes.items():
            if name not in SCOPES:
                raise ValueError(f"logging.scopes: unknown scope {name!r}; scopes are "
                                 f"{', '.join(SCOPES)}")
            for key in ("every_train_iterations", "min_max"):
                if name != "train" and getattr(scope, key):
                    raise ValueError(f"logging.scopes.{name}.{key}: only the train scope "
                                     "has it")
        return self


class CheckpointConfig(Frozen):
    """The learner's full state (networks, optimizer, counters) in storage."""

    every_train_iterations: int = Field(5000, ge=0, description="the learner saves its full "
                                        "state this often, and at the end; 0: only at the "
                                        "end (and the best stays kept)")
    keep_last: int = Field(3, ge=1, description="checkpoints kept besides the best")
    prefix: str = Field("ckpt", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,31}$",
                        description="checkpoints are stored as <prefix>-<train iteration>")
    metadata: dict[str, str] = Field(default_factory=dict, description="extra strings stored "
                                     "in every checkpoint")
    dir: str | None = Field(None, description="also write every checkpoint as a file "
                            "<dir>/<prefix>-<train iteration>.safetensors (relative: to the "
                            "run directory), pruned along with storage's copies")


class CoordinatorConfig(Frozen):
    """Membership, snapshots and storage upkeep."""

    heartbeat_interval_s: float = Field(1.0, gt=0, description="how often workers heartbeat")
    heartbeat_timeout_s: float = Field(10.0, gt=0, description="a worker silent this long is "
                                       "declared dead: its tasks go to others")
    task_push_timeout_s: float = Field(5.0, gt=0, description="how long the coordinator waits "
                                       "for a worker to accept a pushed task")
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
    commander: str | None = Field(None, description=(
        "import path `package.module:Class` of the run's commander "
        "(`rlfleet.shared.contract.commander.Commander`), made with the run's config: it "
        "chooses each collect and evaluate task's env settings (a curriculum, level seeds) "
        "and sees every evaluation; null: every task runs `env.kwargs`"))

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


class WinRateRule(Frozen):
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


class LeagueConfig(Frozen):
    """Self-play: `env.id` is a two-player game and the main player meets a league of its
    past snapshots and fixed bots (`shared/league/league.py`)."""

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
