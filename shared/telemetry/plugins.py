"""Metric writers of the user's (`logging.writers`): more destinations of every record.

A writer is a class named by import path and made in the coordinator, where the run's one
logger lives, with the run's place and name and its `params`:

    class MyWriter:
        def __init__(self, run_dir: Path, run_name: str, config: dict, resume: bool,
                     **params): ...
        def write(self, scope: str, step: int, wall_time: float,
                  scalars: Mapping[str, float]) -> None: ...
        def flush(self) -> None: ...
        def close(self) -> None: ...

(`video(tag, step, mp4, gif, fps)` too, if it shows videos.) A writer that cannot be made, or
that raises, is logged and left out, once: like a broken W&B, a broken writer never stops a
run or the other writers (`rlfleet up` imports and checks each at launch, so a misspelt path
is refused there, naming the field).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlfleet.shared.contract.config import ConfigError, LoggingConfig
from rlfleet.shared.util.imports import ImportPathError, load_object

log = logging.getLogger("rlfleet.logger")

WRITER_METHODS = ("write", "flush", "close")


def writer_class(path: str, what: str) -> type:
    """The class `path` names, checked to be a writer; `ConfigError` naming `what`."""
    try:
        cls = load_object(path, what)
    except ImportPathError as err:
        raise ConfigError(str(err)) from None
    missing = [m for m in WRITER_METHODS if not callable(getattr(cls, m, None))]
    if not isinstance(cls, type) or missing:
        raise ConfigError(f"{what}={path!r} is not a metric writer class"
                          + (f": it lacks {', '.join(missing)}" if missing else ""))
    return cls


def check_writers(cfg: LoggingConfig) -> None:
    """Import every configured writer (at launch): `ConfigError` naming the one that fails."""
    for i, wc in enumerate(cfg.writers):
        writer_class(wc.path, f"logging.writers[{i}]")


def user_writers(cfg: LoggingConfig, run_dir: Path, run_name: str, config: dict,
                 resume: bool) -> list[GuardedWriter]:
    """The configured writers, made; one that fails to be made is logged and left out."""
    out = []
    for i, wc in enumerate(cfg.writers):
        what = f"logging.writers[{i}]={wc.path!r}"
        try:
            cls = writer_class(wc.path, f"logging.writers[{i}]")
            writer = cls(run_dir=run_dir, run_name=run_name, config=config, resume=resume,
                         **wc.params)
        except Exception:
            log.exception("%s: not made; the run goes on without it", what)
            continue
        out.append(GuardedWriter(writer, what))
    return out


class GuardedWriter:
    """A user's writer whose failures are logged once and then leave it out."""

    def __init__(self, writer: Any, what: str) -> None:
        self.writer = writer
        self.what = what
        self.broken = False
        if callable(getattr(writer, "video", None)):
            self.video = self._video

    def _call(self, name: str, *args: Any) -> None:
        if self.broken:
            return
        try:
            getattr(self.writer, name)(*args)
        except Exception:
            self.broken = True
            log.exception("%s failed in %s: left out of the run's logging from now on",
                          self.what, name)

    def write(self, scope: str, step: int, wall_time: float,
              scalars: Mapping[str, float]) -> None:
        self._call("write", scope, step, wall_time, scalars)

    def flush(self) -> None:
        self._call("flush")

    def close(self) -> None:
        self._call("close")

    def _video(self, tag: str, step: int, mp4: Path, gif: bytes | None, fps: int) -> None:
        self._call("video", tag, step, mp4, gif, fps)
