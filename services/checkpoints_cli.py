"""`rlfleet checkpoints RUN_DIR`: the checkpoints a run's learner kept, and one of them in use.

A run's checkpoints are in its storage (the run directory's `storage/`, or the Redis its
`config.yaml` names), listed by the learner's checkpoint index (`learner/output/checkpoints.py`):
oldest first, the newest `checkpoint.keep_last` plus the one kept as the best. For each one
the listing reads the checkpoint's own header back: its train iteration, policy version, the
time it was saved, its size and its metadata strings (`run`, `algo` and whatever
`checkpoint.metadata` adds), and where `checkpoint.dir` mirrors them, its file. A rich table
for people, `--json` for tools.

`--checkpoint N` of `rlfleet play`, `serve-policy` and `export` names one of them by its train
iteration: `checkpoint_policy` loads its weights (the learner's full state, of which only the
acting part is used) into a policy of the run's kind, in place of `best_policy.safetensors`.
An N the run did not keep is a `ConfigError` (exit 2) naming the ones it did.

`resume_point` says what `rlfleet resume` continues from: the newest checkpoint, or none.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from rlfleet.learner.output.checkpoints import HOOKS_META, CheckpointInfo, read_index
from rlfleet.shared.contract.codec import CodecError, read_metadata
from rlfleet.shared.contract.config import ConfigError
from rlfleet.shared.infra.storage import Storage, StorageError, open_storage
from rlfleet.shared.run.config import RunConfig, read_run_config

if TYPE_CHECKING:
    from rich.console import JustifyMethod

    from rlfleet.shared.algos.base import Policy

# the metadata every checkpoint carries as its own fields, listed as columns of their own,
# and the learner's own entries (its hooks' states), which are not the user's metadata
COUNTER_KEYS = ("train_iterations", "policy_version", "saved_at")
INTERNAL_KEYS = (*COUNTER_KEYS, HOOKS_META)


@dataclass
class Listed:
    """One kept checkpoint, as its header says."""

    name: str
    train_iterations: int
    policy_version: int
    best: bool
    saved_at: float  # seconds since the epoch
    size_bytes: int | None  # None: listed but missing from storage
    metadata: dict[str, str] = field(default_factory=dict)  # run, algo, checkpoint.metadata
    file: str | None = None  # its copy in checkpoint.dir, where there is one

    @property
    def saved_at_iso(self) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(self.saved_at))


@dataclass
class RunCheckpoints:
    run_dir: Path
    storage: str
    prefix: str
    checkpoints: list[Listed]

    @property
    def iterations(self) -> list[int]:
        return [c.train_iterations for c in self.checkpoints]

    def as_json(self) -> dict:
        return {"run_dir": str(self.run_dir), "storage": self.storage, "prefix": self.prefix,
                "best": next((c.train_iterations for c in self.checkpoints if c.best), None),
                "checkpoints": [{**asdict(c), "saved_at_iso": c.saved_at_iso}
                                for c in self.checkpoints]}


def storage_url(cfg: RunConfig, run_dir: Path) -> str:
    """Where the run's storage is, as `rlfleet play`/`export` find it."""
    return cfg.storage or str(run_dir / "storage")


def _open(cfg: RunConfig, run_dir: Path, max_retry_s: float | None = None
          ) -> Storage | None:
    """The run's storage; None for a storage directory that does not exist (opening one
    would create it)."""
    url = storage_url(cfg, run_dir)
    if not url.startswith(("redis://", "rediss://", "unix://")) and \
            not Path(url.removeprefix("file://")).is_dir():
        return None
    return open_storage(url, cfg.name, max_retry_s)


def _listed(storage: Storage, info: CheckpointInfo, best: bool, mirror: Path | None
            ) -> Listed:
    blob = storage.get_blob(info.name)
    meta: dict[str, str] = {}
    if blob is not None:
        try:
            meta = read_metadata(blob)
        except CodecError:  # listed, but not a whole safetensors blob: shown without metadata
            meta = {}
    file = mirror / info.file_name if mirror is not None else None
    return Listed(info.name, info.train_iterations, info.policy_version, best, info.saved_at,
                  None if blob is None else len(blob),
                  {k: v for k, v in meta.items() if k not in INTERNAL_KEYS},
                  str(file) if file is not None and file.is_file() else None)


def list_checkpoints(run_dir: str | Path, max_retry_s: float | None = None
                     ) -> RunCheckpoints:
    """The checkpoints the run's storage holds, oldest first. Raises `ConfigError` for a
    directory that is no run's, `StorageError` for a storage that cannot be read (Redis:
    after riding out an outage for `max_retry_s`, default `RLFLEET_STORAGE_RETRY_S`)."""
    run_dir = Path(run_dir)
    cfg = read_run_config(run_dir)
    prefix = cfg.checkpoint.prefix
    url = storage_url(cfg, run_dir)
    storage = _open(cfg, run_dir, max_retry_s)
    if storage is None:
        return RunCheckpoints(run_dir, url, prefix, [])
    mirror = Path(cfg.checkpoint.dir) if cfg.checkpoint.dir else None
    if mirror is not None and not mirror.is_absolute():
        mirror = run_dir / mirror
    try:
        index = read_index(storage, prefix)
        listed = [_listed(storage, e, e.name == index.best, mirror) for e in index.entries]
    finally:
        storage.close()
    return RunCheckpoints(run_dir, url, prefix, listed)


def _size(n: int | None) -> str:
    if n is None:
        return "missing"
    size = float(n)
    for unit in ("B", "KB", "MB"):
        if size < 1024 or unit == "MB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(size)


def print_checkpoints(listed: RunCheckpoints, as_json: bool = False) -> None:
    if as_json:
        print(json.dumps(listed.as_json(), indent=2))
        return
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console(highlight=False)
    if not listed.checkpoints:
        console.print(f"{escape(str(listed.run_dir))}: no checkpoints (storage "
                      f"{escape(listed.storage)}, prefix {listed.prefix})")
        return
    console.print(f"{escape(str(listed.run_dir))}: {len(listed.checkpoints)} checkpoints in "
                  f"{escape(listed.storage)} (prefix {listed.prefix})")
    files = {str(Path(c.file).parent) for c in listed.checkpoints if c.file}
    if files:  # checkpoint.dir: one directory for all
        console.print(f"files in {escape(', '.join(sorted(files)))}")
    table = Table()  # narrow enough for 80 columns: metadata one item a line
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("train iteration", "right"), ("policy version", "right"), ("best", "center"),
        ("saved", "left"), ("size", "right"))
    for name, justify in columns:
        table.add_column(name, justify=justify)
    table.add_column("metadata", overflow="fold")
    for c in listed.checkpoints:
        meta = "\n".join(f"{k}={v}" for k, v in sorted(c.metadata.items()))
        table.add_row(str(c.train_iterations), str(c.policy_version), "yes" if c.best else "",
                      time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(c.saved_at)),
                      _size(c.size_bytes), escape(meta))
    console.print(table)
    console.print("use one with --checkpoint N (rlfleet play, serve-policy, export)")


def _chosen(cfg: RunConfig, run_dir: Path, iteration: int) -> tuple[Storage, CheckpointInfo]:
    """The run's storage (open) and the kept checkpoint at train iteration `iteration`."""
    storage = _open(cfg, run_dir)
    entries = [] if storage is None else read_index(storage, cfg.checkpoint.prefix).entries
    found = next((e for e in entries if e.train_iterations == iteration), None)
    if found is None or storage is None:
        if storage is not None:
            storage.close()
        kept = (f"its checkpoints are at train iterations "
                f"{', '.join(str(e.train_iterations) for e in entries)}" if entries
                else "it has no checkpoints")
        raise ConfigError(f"--checkpoint={iteration}: {run_dir} kept no checkpoint at train "
                          f"iteration {iteration}; {kept} (`rlfleet checkpoints {run_dir}`)")
    return storage, found


def checkpoint_blob(cfg: RunConfig, run_dir: Path, iteration: int
                    ) -> tuple[bytes, CheckpointInfo]:
    """The safetensors bytes of the run's checkpoint at train iteration `iteration`."""
    storage, info = _chosen(cfg, run_dir, iteration)
    try:
        blob = storage.get_blob(info.name)
    finally:
        storage.close()
    if blob is None:
        raise ConfigError(f"--checkpoint={iteration}: {info.name} is listed in {run_dir}'s "
                          "storage but missing from it")
    return blob, info


def checkpoint_policy(cfg: RunConfig, run_dir: Path, iteration: int, seed: int | None = None
                      ) -> tuple[Policy, int]:
    """A policy of the run's kind acting with the weights of its checkpoint at train
    iteration `iteration`, and that checkpoint's policy version. One torch thread, as in a
    collector."""
    import torch

    from rlfleet.shared.algos.registry import make_policy
    from rlfleet.shared.algos.reward_model import with_reward_model
    from rlfleet.shared.contract.codec import decode_weights
    from rlfleet.shared.envs.make import run_spec

    blob, info = checkpoint_blob(cfg, run_dir, iteration)
    torch.set_num_threads(1)
    state, meta = decode_weights(blob)
    version = int(meta.get("policy_version", info.policy_version))
    spec = run_spec(cfg)
    seed = cfg.seed if seed is None else seed
    # built as the learner built it (a reward model's state is part of its checkpoints)
    policy = with_reward_model(make_policy(cfg.algo, spec, seed), cfg.algo, spec, seed)
    policy.load_state_dict(state)
    policy.load_policy(version, policy.policy_state())
    return policy, version


def resume_point(run_dir: str | Path) -> str:
    """What `rlfleet resume` continues from, in words: the newest checkpoint the run's
    storage holds (the one its learner restores), or none."""
    run_dir = Path(run_dir)
    try:
        listed = list_checkpoints(run_dir, max_retry_s=2.0)
    except (ConfigError, StorageError, OSError, ValueError) as err:
        return f"checkpoints not read ({err})"
    present = [c for c in listed.checkpoints if c.size_bytes is not None]
    if not present:
        return "no checkpoint: from the start of training"
    c = present[-1]
    saved = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(c.saved_at))
    return (f"from checkpoint {c.name} (train iteration {c.train_iterations}, policy version "
            f"{c.policy_version}, saved {saved})")


def main(run_dir: str, as_json: bool) -> int:
    try:
        listed = list_checkpoints(run_dir)
    except StorageError as err:
        print(f"rlfleet checkpoints: {run_dir}'s storage cannot be read: {err}",
              file=sys.stderr)
        return 1
    print_checkpoints(listed, as_json)
    return 0
