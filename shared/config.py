"""Run configuration: one frozen pydantic model per component, loaded from YAML.

Every role reads the same `RunConfig`: the coordinator loads it from a file and hands it to
each worker at registration, so a worker container needs nothing but the coordinator's URL.
Unknown keys are errors (a typo in a hyperparameter must not silently fall back to a default),
and every error names the dotted path of the offending field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class ConfigError(ValueError):
    """A config file that cannot be used; the message names the field and the file."""


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EnvConfig(_Frozen):
    id: str = Field("CartPole-v1", description="gymnasium environment id")
    num_envs: int = Field(4, ge=1, le=1024, description="envs per collector's vector env")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="passed to gymnasium.make")


class DQNConfig(_Frozen):
    name: Literal["dqn"] = "dqn"
    hidden_sizes: tuple[int, ...] = Field((128, 128), description="MLP widths of the Q-network")
    lr: float = Field(1e-3, gt=0)
    gamma: float = Field(0.99, ge=0, le=1)
    batch_size: int = Field(64, ge=1, le=65536)
    target_update_every: int = Field(250, ge=1, description="train iterations between hard "
                                     "target-network copies")
    max_grad_norm: float = Field(10.0, gt=0)
    eps_start: float = Field(1.0, ge=0, le=1)
    eps_end: float = Field(0.05, ge=0, le=1)
    eps_decay_steps: int = Field(10_000, ge=1, description="global env steps over which epsilon "
                                 "decays linearly")
    learning_starts: int = Field(1000, ge=0, description="env steps in the buffer before the "
                                 "first update")
    updates_per_env_step: float | None = Field(
        0.25, gt=0, description="replay ratio the coordinator holds learners and collectors to "
        "(train iterations per env step); null lets both run free")
    ratio_tolerance: int = Field(2000, ge=1, description="train iterations either side of the "
                                 "replay ratio before the side that is ahead is made to wait")


class CollectorConfig(_Frozen):
    chunk_size: int = Field(256, ge=1, le=1_000_000, description="transitions per chunk")
    report_interval_s: float = Field(0.05, gt=0, description="how long chunk metadata may wait "
                                     "to be batched into one report")
    policy_check_interval_s: float = Field(0.02, ge=0, description="minimum time between two "
                                           "looks for a newer policy version")


class BufferConfig(_Frozen):
    kind: Literal["uniform"] = "uniform"
    capacity: int = Field(100_000, ge=1, description="transitions kept; oldest chunks evicted")


class LearnerConfig(_Frozen):
    publish_every: int = Field(10, ge=1, description="train iterations between policy versions")
    batches_per_request: int = Field(32, ge=1, le=1024, description="batches one sample "
                                     "request carries")
    prefetch_requests: int = Field(2, ge=1, le=64, description="sample responses held ready")
    chunk_cache: int = Field(4096, ge=1, description="chunks the learner keeps decoded")
    learn_info_interval_s: float = Field(0.1, gt=0)


class EvalConfig(_Frozen):
    every_env_steps: int = Field(5000, ge=1)
    episodes: int = Field(10, ge=1, le=1000)
    num_envs: int = Field(10, ge=1, le=1000, description="eval episodes run side by side")
    stop_value: float | None = Field(475.0, description="mean deterministic return that ends "
                                     "the run as solved")


class StopConfig(_Frozen):
    max_env_steps: int | None = Field(None, ge=1)
    max_wall_s: float | None = Field(None, gt=0)


class CoordinatorConfig(_Frozen):
    heartbeat_interval_s: float = Field(1.0, gt=0)
    heartbeat_timeout_s: float = Field(10.0, gt=0)
    task_push_timeout_s: float = Field(5.0, gt=0)

    @model_validator(mode="after")
    def _timeout_exceeds_interval(self) -> CoordinatorConfig:
        if self.heartbeat_timeout_s <= self.heartbeat_interval_s:
            raise ValueError(f"heartbeat_timeout_s={self.heartbeat_timeout_s} must exceed "
                             f"heartbeat_interval_s={self.heartbeat_interval_s}")
        return self


class RunConfig(_Frozen):
    name: str = Field("run", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
    seed: int = 0
    env: EnvConfig = EnvConfig()
    algo: DQNConfig = DQNConfig()
    collector: CollectorConfig = CollectorConfig()
    buffer: BufferConfig = BufferConfig()
    learner: LearnerConfig = LearnerConfig()
    eval: EvalConfig = EvalConfig()
    stop: StopConfig = StopConfig()
    coordinator: CoordinatorConfig = CoordinatorConfig()
    storage: str | None = Field(None, description="directory path or redis://host:port/db; "
                                "default: <run-dir>/storage")

    def with_overrides(self, **changes: Any) -> RunConfig:
        """A copy with top-level fields replaced, validated like a file would be."""
        data = self.model_dump()
        data.update({k: v for k, v in changes.items() if v is not None})
        return parse_config(data, "overrides")


def format_validation_error(err: ValidationError, source: str = "config") -> str:
    """One line per problem, each naming the dotted field path."""
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(root)"
        lines.append(f"{source}: field '{loc}': {e['msg']}")
    return "\n".join(lines)


def parse_config(data: Any, source: str = "config") -> RunConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level, got "
                          f"{type(data).__name__}")
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, source)) from None


def load_config(path: str | Path) -> RunConfig:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise ConfigError(f"cannot read config file {path}: {err.strerror}") from None
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from None
    return parse_config(data, str(path))
