"""What `rlfleet up` or `rlfleet resume` starts, decided from its `LaunchOptions` before
anything starts: the run's resolved config, its run directory and storage, how many
collectors and learners, and on which port the coordinator serves (`Plan`). Making the plan
checks the config (exit 2 and one line naming the field, before any child exists) and writes
what the run directory keeps of it: `config.yaml`, the resolved config every child reads (the
launch's `KEY=VALUE` overrides applied), and `launch.json`, the worker counts a resume of a
run killed before its summary starts again with.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from rlfleet.local.options import DEFAULT_COLLECTORS, LaunchOptions
from rlfleet.local.precheck import check_config
from rlfleet.shared.contract.config import ConfigError
from rlfleet.shared.infra.storage.credentials import (
    PASSWORD_ENV,
    PASSWORD_FILE_ENV,
    configured_password,
    has_password,
    split_password,
)
from rlfleet.shared.run.config import RunConfig, dump_config, load_config, parse_config
from rlfleet.shared.run.overrides import apply_overrides, parse_overrides, touches, value_at

CONFIG_FILE = "config.yaml"  # the resolved config, in the run directory
LAUNCH_FILE = "launch.json"  # the worker counts a run was started with

# What a resume may not change, and why: what the run's storage, snapshot and checkpoints
# were made for. Anything else (the learning rate, the stop rules, evaluation, logging, the
# collectors' settings) a resume may change.
RESUME_FIXED = {
    "name": "it is the run's storage namespace, where its snapshot and checkpoints are",
    "storage": "the run's snapshot, chunks and checkpoints are there",
    "env": "the stored chunks and the checkpointed networks were made for this env's "
           "observations and actions",
    "algo.name": "the checkpoints hold this algorithm's networks and optimizer state",
    "algo.policy": "the checkpoints hold this policy class's networks",
    "algo.hidden_sizes": "the checkpointed networks have these layer widths",
    "algo.obs_norm": "the checkpoints hold (or lack) the observation statistics",
    "buffers": "the coordinator restores the buffers, as they were made, from the run's "
               "snapshot",
}


@dataclass(frozen=True)
class Plan:
    """A run about to start. `config` is what `config_path` holds: the file's config with
    the launch's seed, budget and learner count, the run's name (its directory's, unique
    per run, so a shared Redis never mixes runs) and its storage."""

    config: RunConfig
    config_path: Path     # <run_dir>/config.yaml
    config_named: str     # the config as the launch named it (summary.json: config)
    run_dir: Path
    storage: str          # with any password redacted (the children get it from the env)
    collectors: int
    learners: int
    learners_given: int | None  # as asked for (launch.json); None: the config's count
    resume: bool = False
    # A resume given --collectors: it replaces the wish the coordinator restores.
    replaces_wish: bool = False
    port: int | None = None  # the coordinator's on 127.0.0.1; None: a free one
    collector_nice: int = 0
    max_restarts: int = 0
    overrides: tuple[str, ...] = ()  # the launch's KEY=VALUE items, applied

    def headline(self) -> str:
        """The launcher's first line (rich markup), and the overrides applied on a second."""
        from rich.markup import escape

        learners = f"{self.learners} learner{'s' if self.learners != 1 else ''}"
        line = (f"[bold]rlfleet {'resume' if self.resume else 'up'}[/]: {self.config.env.id} "
                f"with {self.collectors} collectors, {learners}, storage {self.storage}, "
                f"run dir {self.run_dir}")
        if self.overrides:
            line += f"\noverrides: {escape(' '.join(self.overrides))}"
        return line


def make_plan(options: LaunchOptions) -> Plan:
    """The plan of `rlfleet up` (or, with `options.resume`, of `rlfleet resume`), its config
    checked and its files written to the run directory. Raises `ConfigError`."""
    plan = _resume(options) if options.resume else _up(options)
    (plan.run_dir / LAUNCH_FILE).write_text(json.dumps(
        {"collectors": plan.collectors, "learners": plan.learners_given}))
    return plan


def _up(options: LaunchOptions) -> Plan:
    assert options.config is not None  # `LaunchOptions` requires it of a new run
    overrides = options.overrides
    cfg = load_config(options.config, overrides)
    check_config(cfg, options.config, devices=options.local_devices)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir = Path(options.run_dir or Path("runs") / f"{cfg.name}-{stamp}").resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    storage = hold_password(options.storage or cfg.storage or str(run_dir / "storage"))
    learner = None
    if options.learners is not None:  # validated like the file's learner.count
        learner = {**cfg.learner.model_dump(), "count": options.learners}
    cfg = cfg.with_overrides(seed=options.seed, name=run_dir.name[:64], storage=storage,
                             stop=_budget(cfg, options), learner=learner)
    data = absolute_paths(cfg.model_dump(mode="json"), run_dir)
    config_path = run_dir / CONFIG_FILE
    config_path.write_text(dump_config(data))
    config = parse_config(data, str(config_path))
    collectors = DEFAULT_COLLECTORS if options.collectors is None else options.collectors
    return Plan(config=config, config_path=config_path, config_named=options.config,
                run_dir=run_dir, storage=storage, collectors=collectors,
                learners=config.learner.count if options.learners is None
                else options.learners,
                learners_given=options.learners, port=options.port,
                collector_nice=options.collector_nice, max_restarts=options.max_restarts,
                overrides=overrides)


def _resume(options: LaunchOptions) -> Plan:
    """A run directory `rlfleet up` made: its resolved config names the run and its storage,
    where the coordinator's snapshot and the learner's checkpoints are. Counts not given are
    the run's last (summary.json is written as a run ends; a run killed before then left
    launch.json); the coordinator restores the last `rlfleet scale` wish besides."""
    assert options.run_dir is not None  # `LaunchOptions` requires it of a resume
    run_dir = Path(options.run_dir).resolve()
    config_path = run_dir / CONFIG_FILE
    if not config_path.is_file():
        raise ConfigError(f"{run_dir} is not a run directory: it has no {CONFIG_FILE}")
    cfg = load_config(config_path)
    overrides = options.overrides
    if overrides:
        try:
            changed = load_config(config_path, overrides)
        except ConfigError:  # a change of algorithm fails as a config first: say why not
            data = yaml.safe_load(config_path.read_text())
            refuse_fixed(data, apply_overrides(data, parse_overrides(overrides)), overrides)
            raise
        refuse_fixed(cfg.model_dump(mode="json"), changed.model_dump(mode="json"), overrides)
        cfg = parse_config(absolute_paths(changed.model_dump(mode="json"), run_dir),
                           str(config_path))
    check_config(cfg, config_path)
    stop = _budget(cfg, options)
    if stop != cfg.stop.model_dump() or overrides:
        cfg = cfg.with_overrides(stop=stop)
        config_path.write_text(dump_config(cfg.model_dump(mode="json")))
    previous = next((p for p in (run_dir / "summary.json", run_dir / LAUNCH_FILE)
                     if p.is_file()), None)
    before = json.loads(previous.read_text()) if previous is not None else {}
    collectors = (options.collectors if options.collectors is not None
                  else before.get("collectors", DEFAULT_COLLECTORS))
    learners = options.learners if options.learners is not None else before.get("learners")
    assert cfg.storage is not None  # `up` always writes the storage it used
    storage = hold_password(cfg.storage)
    return Plan(config=cfg, config_path=config_path, config_named=str(config_path),
                run_dir=run_dir, storage=storage, collectors=collectors,
                learners=cfg.learner.count if learners is None else learners,
                learners_given=learners, resume=True,
                replaces_wish=options.collectors is not None, port=options.port,
                collector_nice=options.collector_nice, max_restarts=options.max_restarts,
                overrides=overrides)


def refuse_fixed(before: dict, after: dict, overrides: tuple[str, ...]) -> None:
    """A resume's overrides may change anything but what the run's stored state was made
    for (`RESUME_FIXED`): `before` and `after` are the config's data without and with them.
    Raises `ConfigError` naming the field, the override and why."""
    for field, why in RESUME_FIXED.items():
        if value_at(before, field) == value_at(after, field):
            continue
        items = [i for i in overrides if touches(i.partition("=")[0].strip(), field)]
        raise ConfigError(f"override {' '.join(items) or ' '.join(overrides)}: a resume "
                          f"cannot change {field} ({why}); start a new run with `rlfleet up` "
                          "instead")


def _budget(cfg: RunConfig, options: LaunchOptions) -> dict:
    """The config's stop rules with the launch's budget in place of its own."""
    stop = cfg.stop.model_dump()
    if options.max_wall_s:
        stop["max_wall_s"] = options.max_wall_s
    if options.max_env_steps:
        stop["max_env_steps"] = options.max_env_steps
    return stop


def absolute_paths(data: dict, run_dir: Path) -> dict:
    """Paths the workers read, made absolute (they may run elsewhere than this directory):
    datasets relative to where `up` was run, the buffer saver's and the checkpoint files'
    directories to the run's."""
    for bcfg in data["buffers"].values():
        if bcfg.get("path"):
            bcfg["path"] = str(Path(bcfg["path"]).expanduser().resolve())
    if (data["eval"].get("dataset") or {}).get("path"):
        data["eval"]["dataset"]["path"] = str(Path(data["eval"]["dataset"]["path"])
                                              .expanduser().resolve())
    if data["collector"].get("save_to"):
        data["collector"]["save_to"] = str(run_dir / Path(data["collector"]["save_to"])
                                           .expanduser())
    if (data.get("checkpoint") or {}).get("dir"):  # checkpoint files: the run's, as above
        data["checkpoint"]["dir"] = str(run_dir / Path(data["checkpoint"]["dir"]).expanduser())
    return data


def hold_password(storage: str) -> str:
    """The storage URL with its password redacted, for the config, the console and every
    file of the run. The processes this launcher starts get the password in their
    environment (`RLFLEET_STORAGE_PASSWORD`), never on a command line; a URL whose password
    was redacted already (a resumed run) needs it configured (`RLFLEET_STORAGE_PASSWORD_FILE`)."""
    storage, password = split_password(storage)
    if password is not None:
        os.environ[PASSWORD_ENV] = password
    elif has_password(storage) and configured_password() is None:
        raise ConfigError(f"storage {storage} needs its password: name a file holding it in "
                          f"{PASSWORD_FILE_ENV} (or give the whole URL with --storage)")
    return storage
