"""Metric writers of the user's (`logging.writers`): more destinations of every record.

A writer is a class named by import path and made in the coordinator, where the run's one
logger lives, with the run's place and name and its `params`; it satisfies `MetricWriter`
(and `VideoWriter`, `HistogramWriter` if it shows those), which `rlfleet` exports:

    class MyWriter:
        def __init__(self, run_dir: Path, run_name: str, config: dict, resume: bool,
                     **params): ...
        def write(self, scope: str, step: int, wall_time: float,
                  scalars: Mapping[str, float]) -> None: ...
        def flush(self) -> None: ...
        def close(self) -> None: ...

A writer that cannot be made, or that raises, is logged and left out, once: like a broken
W&B, a broken writer never stops a run or the other writers (`rlfleet up` imports and checks
each at launch, so a misspelt path is refused there, naming the field).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rlfleet.shared.contract.config import LoggingConfig
from rlfleet.shared.contract.plugins import PluginKind, load_plugin, make_plugin
from rlfleet.shared.telemetry.log_writers import HistogramWriter, MetricWriter, VideoWriter

log = logging.getLogger("rlfleet.logger")

WRITER = PluginKind("metric writer", required=(MetricWriter,), subclass="rlfleet.MetricWriter")


def writer_class(path: str, what: str) -> type:
    """The class `path` names, checked to be a writer; `ConfigError` naming `what`."""
    return load_plugin(path, what, WRITER)


def check_writers(cfg: LoggingConfig) -> None:
    """Import every configured writer (at launch): `ConfigError` naming the one that fails."""
    for i, wc in enumerate(cfg.writers):
        writer_class(wc.path, f"logging.writers[{i}]")


def user_writers(cfg: LoggingConfig, run_dir: Path, run_name: str, config: dict,
                 resume: bool) -> list[GuardedWriter]:
    """The configured writers, made; one that fails to be made is logged and left out."""
    out = []
    for i, wc in enumerate(cfg.writers):
        what = f"logging.writers[{i}]"
        try:
            cls = writer_class(wc.path, what)
            writer = make_plugin(cls, what, run_dir=run_dir, run_name=run_name,
                                 config=config, resume=resume, **wc.params)
        except Exception:
            log.exception("%s=%r: not made; the run goes on without it", what, wc.path)
            continue
        out.append(GuardedWriter(writer, f"{what}={wc.path!r}"))
    return out


class GuardedWriter:
    """A user's writer whose failures are logged once and then leave it out. What it can
    show besides records is asked once, here (`shows`)."""

    def __init__(self, writer: MetricWriter, what: str) -> None:
        self.writer = writer
        self.what = what
        self.broken = False
        self._video = writer.video if isinstance(writer, VideoWriter) else None
        self._histograms = writer.histograms if isinstance(writer, HistogramWriter) else None

    def shows(self, kind: type) -> bool:
        """Whether the wrapped writer is a `VideoWriter` or `HistogramWriter` (`kind`)."""
        return isinstance(self.writer, kind)

    def _call(self, name: str, method: Callable[..., None] | None, *args: Any) -> None:
        if self.broken or method is None:
            return
        try:
            method(*args)
        except Exception:
            self.broken = True
            log.exception("%s failed in %s: left out of the run's logging from now on",
                          self.what, name)

    def write(self, scope: str, step: int, wall_time: float,
              scalars: Mapping[str, float]) -> None:
        self._call("write", self.writer.write, scope, step, wall_time, scalars)

    def flush(self) -> None:
        self._call("flush", self.writer.flush)

    def close(self) -> None:
        self._call("close", self.writer.close)

    def video(self, tag: str, step: int, mp4: Path, gif: bytes | None, fps: int) -> None:
        self._call("video", self._video, tag, step, mp4, gif, fps)

    def histograms(self, step: int, histograms: Mapping[str, Any]) -> None:
        self._call("histograms", self._histograms, step, histograms)


def shows(writer: MetricWriter, kind: type) -> bool:
    """Whether `writer` (a built-in one, or a user's behind its guard) shows `kind`'s
    extra (`VideoWriter`, `HistogramWriter`)."""
    if isinstance(writer, GuardedWriter):
        return writer.shows(kind)
    return isinstance(writer, kind)
