"""A run's whole config: `RunConfig`, assembled from the contract's sections and the
algorithm's own config, loaded from YAML (a file, or a ready run shipped in the package).

Every role reads the same `RunConfig`: the coordinator loads it from a file and hands it to
each worker at registration, so a worker container needs nothing but the coordinator's URL.
Its own checks are the ones across sections (buffers the learner draws from, rate-limit
bands, the league); what an algorithm needs of the run comes from its spec in the
algorithm registry, and `rlfleet.shared.run.check` answers whether a config can run at all.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import UnionType
from typing import TYPE_CHECKING, Annotated, Any, TypeAlias, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, Field, ValidationError, model_validator

from rlfleet.shared.algos.dqn.config import DQNConfig
from rlfleet.shared.algos.registry import ALGORITHMS, algo_spec
from rlfleet.shared.contract.algo import (
    AlgoConfig,
    EpsilonGreedySettings,
    ObsNormSettings,
    RolloutSettings,
)
from rlfleet.shared.contract.config import (
    BUILT_IN_BOTS,
    BufferConfig,
    CheckpointConfig,
    CollectorConfig,
    ConfigError,
    CoordinatorConfig,
    EnvConfig,
    EvalConfig,
    Frozen,
    LeagueConfig,
    LearnerConfig,
    LoggingConfig,
    StopConfig,
    split_batch,
)
from rlfleet.shared.run.overrides import (
    apply_overrides,
    parse_overrides,
    touches,
)

# libyaml's parser and emitter when PyYAML has them: the same documents in and out, several
# times faster; every role and the launcher read the run's config as they start.
_FAST_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_FAST_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)

# The config of whichever algorithm `algo.name` names: one class per registry entry. A type
# checker cannot evaluate a union built at import: it reads their common base, and the
# settings only some algorithms have through isinstance (`isinstance(algo, RolloutSettings)`).
if TYPE_CHECKING:
    AlgoConfigs: TypeAlias = AlgoConfig
else:
    AlgoConfigs = Annotated[Union[tuple(spec.config for spec in ALGORITHMS.values())],  # noqa: UP007
                            Field(discriminator="name")]
ALGO_NAMES = tuple(ALGORITHMS)


def _uses_obs_norm(algo: Any) -> bool:
    return isinstance(algo, ObsNormSettings) and algo.obs_norm


class RunConfig(Frozen):
    """One run: its env, algorithm, buffers, workers, evaluation, stop rules and logging."""

    name: str = Field("run", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", description="the "
                      "run's name: its storage namespace and run directory")
    seed: int = Field(0, description="seeds every worker's envs and networks (each from its "
                      "own offset)")
    env: EnvConfig = EnvConfig()
    algo: AlgoConfigs = Field(default_factory=DQNConfig,
                              description="the algorithm: `name` picks one of the registry's "
                              f"({', '.join(ALGO_NAMES)}), and its settings with it")
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

    # The checks across sections, one rule each. Pydantic runs them in this order and stops at
    # the first that fails: later ones rely on earlier ones (the rate limits read the buffers
    # `learner.mix` names, so those must exist), and the order decides which of two faults a
    # config is told of first.

    @model_validator(mode="after")
    def _buffers_named(self) -> RunConfig:
        if not self.buffers:
            raise ValueError("buffers: at least one buffer is needed")
        for name in self.buffers:
            if not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", name):
                raise ValueError(f"buffers: name {name!r} must be letters, digits, _ . -")
        return self

    @model_validator(mode="after")
    def _mix_names_buffers(self) -> RunConfig:
        for part in self.learner.mix:
            if part.buffer not in self.buffers:
                raise ValueError(f"learner.mix names buffer {part.buffer!r}, not one of "
                                 f"{sorted(self.buffers)}")
        return self

    @model_validator(mode="after")
    def _rate_limit_bands_hold_a_batch(self) -> RunConfig:
        for part in self.learner.mix:
            share = max(1, round(part.fraction * self.algo.batch_size))
            bcfg = self.buffers[part.buffer]
            # sequence kinds: a sampled sequence counts its rows (as their buffers count)
            items = share * (bcfg.sequence_length if bcfg.kind in ("episode", "sequence")
                             else 1)
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
        return self

    @model_validator(mode="after")
    def _queue_buffers_are_not_mixed(self) -> RunConfig:
        queues = [p.buffer for p in self.learner.mix if self.buffers[p.buffer].kind == "queue"]
        if queues and len(self.learner.mix) > 1:
            raise ValueError(f"learner.mix: queue buffer {queues[0]!r} hands out whole chunks "
                             "and cannot be mixed with other buffers")
        return self

    @model_validator(mode="after")
    def _mix_feeds_the_algorithm(self) -> RunConfig:
        if self.algo.policy is None:  # a user's class says what it learns from when built
            spec = algo_spec(self.algo.name)
            problem = self.feed_problem(spec.title, spec.on_policy, spec.buffer_kinds)
            if problem:
                raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _eval_is_scheduled(self) -> RunConfig:
        if self.eval.every_env_steps is None and self.eval.every_train_iterations is None:
            raise ValueError("eval: set every_env_steps or every_train_iterations")
        return self

    @model_validator(mode="after")
    def _mix_fractions_sum_to_one(self) -> RunConfig:
        total = sum(p.fraction for p in self.learner.mix)
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"learner.mix fractions sum to {total}, not 1")
        return self

    @model_validator(mode="after")
    def _insert_into_names_writable_buffers(self) -> RunConfig:
        for name in self.collector.insert_into or ():
            if name not in self.buffers:
                raise ValueError(f"collector.insert_into names buffer {name!r}, not one of "
                                 f"{sorted(self.buffers)}")
            if self.buffers[name].kind == "dataset":
                raise ValueError(f"collector.insert_into names buffer {name!r}, a read-only "
                                 "dataset buffer")
        return self

    @model_validator(mode="after")
    def _apex_explores_with_epsilon(self) -> RunConfig:
        if self.collector.epsilon_schedule == "apex" and not isinstance(
                self.algo, EpsilonGreedySettings):
            greedy = sorted(n for n, spec in ALGORITHMS.items()
                            if issubclass(spec.config, EpsilonGreedySettings))
            raise ValueError(f"collector.epsilon_schedule='apex' gives each collector a fixed "
                             f"epsilon; algo.name={self.algo.name!r} does not explore with "
                             f"epsilon (an epsilon-greedy algorithm does: "
                             f"{', '.join(greedy)})")
        return self

    @model_validator(mode="after")
    def _saved_chunks_hold_raw_observations(self) -> RunConfig:
        if self.collector.save_to is not None and _uses_obs_norm(self.algo):
            raise ValueError("collector.save_to: with algo.obs_norm chunks hold normalised "
                             "observations, which are no dataset of the env")
        return self

    @model_validator(mode="after")
    def _learner_group_splits_the_work(self) -> RunConfig:
        problem = self.group_problem(self.learner.count)
        if problem:
            raise ValueError(f"learner.count={self.learner.count}: {problem}")
        return self

    @model_validator(mode="after")
    def _league_is_playable(self) -> RunConfig:
        """What can be checked without importing the game (`check_runnable` builds it)."""
        league = self.league
        if league is None:
            return self
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
        return self

    def feed_problem(self, title: str, on_policy: bool,
                     buffer_kinds: frozenset[str] | None = None) -> str | None:
        """Why `learner.mix` cannot feed an algorithm (named `title`) that learns on- or
        off-policy from buffers of `buffer_kinds`, or None: an on-policy algorithm learns
        from whole chunks of exactly one queue buffer, an off-policy one never from a
        queue."""
        mix = self.learner.mix
        queues = [p.buffer for p in mix if self.buffers[p.buffer].kind == "queue"]
        if on_policy and (len(mix) != 1 or not queues):
            return (f"learner.mix: {title} learns from whole chunks of exactly one queue "
                    "buffer (buffers.<name>.kind: queue)")
        if not on_policy and queues:
            return (f"learner.mix: {title} samples transitions; queue buffer {queues[0]!r} "
                    "is for on-policy algorithms")
        for part in mix:
            kind = self.buffers[part.buffer].kind
            if buffer_kinds is not None and kind not in buffer_kinds:
                return (f"learner.mix: buffer {part.buffer!r} is a {kind} buffer; {title} "
                        f"learns from {', '.join(sorted(buffer_kinds))} buffers")
        return None

    @property
    def receiving_buffers(self) -> tuple[str, ...]:
        """The buffers collected chunks go into: `collector.insert_into`, or every buffer
        that is not a read-only dataset."""
        if self.collector.insert_into is not None:
            return self.collector.insert_into
        return tuple(n for n, b in self.buffers.items() if b.kind != "dataset")

    def group_problem(self, learners: int) -> str | None:
        """Why a learner group of this size cannot split this config's work, or None."""
        if learners <= 1:
            return None
        if _uses_obs_norm(self.algo):
            return ("algo.obs_norm: each rank would merge only its own chunks' observation "
                    "counts, so the ranks' statistics would part; use one learner")
        if isinstance(self.algo, RolloutSettings) or any(
                self.buffers[p.buffer].kind == "queue" for p in self.learner.mix):
            rollout = self.rollout_rows
            if rollout < learners:
                return (f"algo.rollout_size={rollout} is smaller than the group: every "
                        "learner needs a share of each rollout")
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

    @property
    def rollout_rows(self) -> int:
        """Transitions per on-policy learn round: `algo.rollout_size` where the algorithm
        learns in rollouts, else one batch."""
        if isinstance(self.algo, RolloutSettings):
            return self.algo.rollout_size
        return self.algo.batch_size

    def with_overrides(self, **changes: Any) -> RunConfig:
        """A copy with top-level fields replaced, validated like a file would be."""
        data = self.model_dump()
        data.update({k: v for k, v in changes.items() if v is not None})
        return parse_config(data, "overrides")


def format_validation_error(err: ValidationError, source: str = "config",
                            blame: Mapping[str, str] | None = None) -> str:
    """One line per problem, each naming the dotted field path. `blame` maps dotted keys
    that overrides set to the text naming them (`override algo.lr=0`): a problem with such a
    field, inside it or with a section holding it is theirs rather than `source`'s."""
    lines = []
    for e in err.errors():
        parts = [str(p) for p in e["loc"]]
        tagged = list(parts)
        # A tagged union puts the tag in the path (algo.dqn.lr): users wrote algo.lr.
        if len(parts) > 1 and parts[0] == "algo" and parts[1] in ALGO_NAMES:
            del parts[1]
        msg = e["msg"]
        if not parts:  # a check across fields: its message starts with the field it blames
            msg = msg.removeprefix("Value error, ")
            named = re.match(r"^([a-z_]+(?:\.[A-Za-z0-9_-]+)*)[=:\s]", msg)
            if named:
                parts = [named.group(1)]
        if e["type"] == "extra_forbidden":
            msg += _known_fields_hint(tagged)
        loc = ".".join(parts) or "(root)"
        by = next((text for key, text in (blame or {}).items() if _blames(key, loc)), source)
        lines.append(f"{by}: field '{loc}': {msg}")
    return "\n".join(lines)


def _blames(key: str, loc: str) -> bool:
    """Whether an override of `key` is behind a problem with field `loc`: it set the field
    or a section around it, or it chose the algorithm whose settings the field is."""
    return touches(key, loc) or (key == "algo.name" and touches("algo", loc))


def _known_fields_hint(loc: list[str]) -> str:
    """For an unknown field at `loc` (the error's own path, union tags in it): the fields
    its section has, the likeliest first."""
    section = _model_at(loc[:-1])
    if section is None:
        return ""
    known = list(section.model_fields)
    close = difflib.get_close_matches(loc[-1], known, n=3)
    if close:
        return f" (did you mean {' or '.join(repr(c) for c in close)}?)"
    return f" (the fields here: {', '.join(sorted(known))})"


def _model_at(loc: list[str]) -> type[BaseModel] | None:
    """The config section (a pydantic model) at a validation error's path, or None."""
    node: Any = RunConfig
    for part in loc:
        while get_origin(node) in (Union, UnionType):  # Optional[X], or the algo's tag next
            members = [a for a in get_args(node) if a is not type(None)]
            if len(members) != 1:
                break
            node = members[0]
        if isinstance(node, type) and issubclass(node, BaseModel):
            field = node.model_fields.get(part)
            if field is None:
                return None
            node = field.annotation
        elif get_origin(node) in (Union, UnionType) and part in ALGORITHMS:
            node = algo_spec(part).config
        elif get_origin(node) is dict:
            node = get_args(node)[1]
        elif get_origin(node) in (list, tuple):
            node = get_args(node)[0]
        else:
            return None
    while get_origin(node) in (Union, UnionType):
        members = [a for a in get_args(node) if a is not type(None)]
        if len(members) != 1:
            return None
        node = members[0]
    return node if isinstance(node, type) and issubclass(node, BaseModel) else None


def parse_config(data: Any, source: str = "config",
                 overrides: Iterable[str] | Mapping[str, Any] | None = None) -> RunConfig:
    """A `RunConfig` from a config's raw data, with dotted overrides applied first
    (`shared/run/overrides.py`: `key=value` strings or a `{dotted key: value}` mapping), so
    the models check them as they check the file. Raises `ConfigError` naming the field, and
    the override that set it."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level, got "
                          f"{type(data).__name__}")
    if overrides is not None and not isinstance(overrides, (Mapping, str)):
        overrides = list(overrides)  # read twice: applied, then named in an error
    changes = parse_overrides(overrides)
    if changes:
        data = apply_overrides(data, changes)
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        if isinstance(overrides, Mapping):
            blame = {key: f"override {key}={value!r}" for key, value in changes.items()}
        else:  # as the user wrote them
            blame = {item.partition("=")[0].strip(): f"override {item}"
                     for item in overrides or ()}
        raise ConfigError(format_validation_error(err, source, blame)) from None


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


def read_run_config(run_dir: str | Path) -> RunConfig:
    """The resolved config `rlfleet up` wrote into a run directory (its `config.yaml`): what
    every tool that reads a run back starts from. `ConfigError` for a directory that is no
    run's."""
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise ConfigError(f"{run_dir} is not a run directory: it has no config.yaml")
    return load_config(path)


def load_config(path: str | Path,
                overrides: Iterable[str] | Mapping[str, Any] | None = None) -> RunConfig:
    """The run config in a YAML file, or in the packaged ready run of that name, with
    dotted overrides applied (`key=value` strings, or a `{dotted key: value}` mapping:
    `{"algo.lr": 3e-4}`). Raises `ConfigError` naming the field."""
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
    return parse_config(data, str(path), overrides)


def dump_config(data: dict[str, Any]) -> str:
    """YAML text of a config's data, in the order given, as `yaml.safe_dump` writes it."""
    return yaml.dump(data, Dumper=_FAST_DUMPER, sort_keys=False)
