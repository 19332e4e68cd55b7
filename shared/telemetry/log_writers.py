"""Where a run's metrics go: JSONL, TensorBoard, Weights & Biases, behind one tiny interface.

`RunLogger` (shared/telemetry/logger.py) decides what is written and cleans the values; a
writer only puts finite floats somewhere. Each writer is imported lazily, so a run that does not use
TensorBoard or W&B never pays for importing them.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import secrets
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from rlfleet.shared.contract.config import WandbConfig

log = logging.getLogger("rlfleet.logger")

TB_DIR = "tb"
WANDB_ID_FILE = "wandb-run-id"
WANDB_STEP_KEY = "env_step"


@runtime_checkable
class MetricWriter(Protocol):
    """One destination of a run's records; `scalars` are finite floats under flat keys.
    A user's writer (`logging.writers`) is made as `cls(run_dir=..., run_name=...,
    config=..., resume=..., **params)`; import it as `rlfleet.MetricWriter`."""

    def write(self, scope: str, step: int, wall_time: float,
              scalars: Mapping[str, float]) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class VideoWriter(Protocol):
    """A writer that can also show videos (TensorBoard, W&B); the others have no `video`.
    `mp4` is already in the run directory; `gif` the same frames as a GIF, where made."""

    def video(self, tag: str, step: int, mp4: Path, gif: bytes | None, fps: int) -> None: ...


@runtime_checkable
class HistogramWriter(Protocol):
    """A writer that can also show histograms (`logging.histograms`: `HistogramData` by
    name, logged as `hist/<name>`)."""

    def histograms(self, step: int, histograms: Mapping[str, Any]) -> None: ...


class JsonlWriter:
    """`metrics.jsonl`: one record per line, flushed to the OS as it is written, so a
    SIGKILL loses at most the line being written (which readers skip)."""

    def __init__(self, path: Path, append: bool) -> None:
        self.path = path
        self._file = path.open("a" if append else "w", encoding="utf-8")

    def write(self, scope: str, step: int, wall_time: float,
              scalars: Mapping[str, float]) -> None:
        record = {"scope": scope, "step": step, "wall_time": wall_time, **scalars}
        self._file.write(json.dumps(record, allow_nan=False) + "\n")
        self._file.flush()

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()


class TensorBoardWriter:
    """Event files under `<run_dir>/tb/`, written with tensorboard's own event writer and
    protos (a fraction of the import of torch's SummaryWriter: the coordinator does not
    otherwise need torch). `purge_step` hides the events a crashed run wrote at or after
    that step, as SummaryWriter(purge_step=...) does: a SessionLog START event at that step,
    so a resumed run's curves have no duplicated points.

    The import and the file open on a thread of their own: they would be most of the
    coordinator's start, which the whole cluster waits for. Records written
    meanwhile are kept and go out first, after the purge event. If tensorboard cannot open,
    one error is logged and the run goes on without it, as it does without W&B."""

    def __init__(self, log_dir: Path, purge_step: int | None) -> None:
        self._lock = threading.Lock()
        self._pending: list[tuple[int, float, dict[str, float]]] = []
        self._writer: Any = None
        self._opened = threading.Event()  # set, with no writer: it could not open
        threading.Thread(target=self._open, args=(log_dir, purge_step),
                         name="tensorboard-open", daemon=True).start()

    def _open(self, log_dir: Path, purge_step: int | None) -> None:
        try:
            from tensorboard.compat.proto.event_pb2 import Event, SessionLog
            from tensorboard.compat.proto.summary_pb2 import Summary
            from tensorboard.summary.writer.event_file_writer import EventFileWriter

            self._event, self._summary = Event, Summary
            log_dir.mkdir(parents=True, exist_ok=True)
            writer = EventFileWriter(str(log_dir), flush_secs=2)
            if purge_step is not None:
                writer.add_event(Event(step=purge_step, wall_time=time.time(),
                                       session_log=SessionLog(status=SessionLog.START)))
        except Exception as err:
            log.error("TensorBoard is off for this run: cannot open %s: %s", log_dir, err)
            with self._lock:
                self._pending.clear()
                self._opened.set()
            return
        with self._lock:
            for step, wall_time, scalars in self._pending:
                self._add(writer, step, wall_time, scalars)
            self._pending.clear()
            self._writer = writer
            self._opened.set()

    def _add(self, writer: Any, step: int, wall_time: float,
             scalars: Mapping[str, float]) -> None:
        values = [self._summary.Value(tag=key, simple_value=float(value))
                  for key, value in scalars.items()]
        writer.add_event(self._event(wall_time=wall_time, step=step,
                                     summary=self._summary(value=values)))

    def write(self, scope: str, step: int, wall_time: float,
              scalars: Mapping[str, float]) -> None:
        with self._lock:
            if self._writer is not None:
                self._add(self._writer, step, wall_time, scalars)
            elif not self._opened.is_set():
                self._pending.append((step, wall_time, dict(scalars)))

    def video(self, tag: str, step: int, mp4: Path, gif: bytes | None, fps: int) -> None:
        """An animated GIF as an image summary: TensorBoard's image plugin plays it (its
        video support needs moviepy and torch's writer; the MP4 is in the run dir)."""
        if gif is None:
            return
        self._opened.wait(10)
        with self._lock:
            if self._writer is None:
                return
            from PIL import Image

            with Image.open(io.BytesIO(gif)) as im:
                width, height = im.size
            image = self._summary.Image(height=height, width=width, colorspace=3,
                                        encoded_image_string=gif)
            self._writer.add_event(self._event(
                wall_time=time.time(), step=step,
                summary=self._summary(value=[self._summary.Value(tag=tag, image=image)])))

    def histograms(self, step: int, histograms: Mapping[str, Any]) -> None:
        """`hist/<name>` in TensorBoard's histogram tab (HistogramData's fields are its
        HistogramProto's)."""
        self._opened.wait(10)
        with self._lock:
            if self._writer is None:
                return
            from tensorboard.compat.proto.summary_pb2 import HistogramProto

            values = [self._summary.Value(tag=f"hist/{name}", histo=HistogramProto(
                min=h.min, max=h.max, num=h.num, sum=h.sum, sum_squares=h.sum_squares,
                bucket_limit=h.bucket_limits, bucket=h.bucket_counts))
                for name, h in histograms.items()]
            self._writer.add_event(self._event(wall_time=time.time(), step=step,
                                               summary=self._summary(value=values)))

    def flush(self) -> None:
        self._opened.wait()
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        self._opened.wait()
        if self._writer is not None:
            self._writer.close()


def wandb_run_id(run_dir: Path, run_name: str, resume: bool) -> str:
    """The W&B id of this run directory: the run name made W&B-safe plus a random suffix,
    kept in `<run_dir>/wandb-run-id` so a resumed run continues the same W&B run, while a
    fresh run (or another run of the same name, e.g. the default "run") gets a new one."""
    path = run_dir / WANDB_ID_FILE
    if resume and path.exists():
        kept = path.read_text().strip()
        if kept:
            return kept
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", run_name).strip("-.")[:48] or "run"
    run_id = f"{slug}-{secrets.token_hex(4)}"
    path.write_text(run_id + "\n")
    return run_id


class WandbWriter:
    """A W&B run in `<run_dir>/wandb/`. It must never fail training: a missing or broken
    wandb, or any error from init/log/finish, logs one warning and turns this writer off.

    Every metric is plotted against `env_step` (a W&B "step metric") rather than W&B's own
    step: W&B drops any `log(step=...)` below a step it has seen, and our scopes share the
    env-step axis without being ordered across each other."""

    def __init__(self, run_dir: Path, cfg: WandbConfig, run_name: str,
                 config: Mapping[str, Any] | None, resume: bool) -> None:
        self._run: Any = None
        os.environ.setdefault("WANDB_SILENT", "true")
        try:
            import wandb
        except Exception as err:  # not installed, or broken at import
            self._disable("cannot import wandb (install it with `pip install "
                          "'rlfleet[wandb]'`)", err)
            return
        try:
            run_id = wandb_run_id(run_dir, run_name, resume)
            self._run = wandb.init(
                project=cfg.project, entity=cfg.entity, mode=cfg.mode, dir=str(run_dir),
                name=run_name, id=run_id, resume="allow",
                config=dict(config) if config is not None else None, reinit="create_new",
                # no console capture in a server process, no system-metrics thread
                settings=wandb.Settings(console="off", silent=True, x_disable_stats=True,
                                        disable_git=True))
            self._run.define_metric(WANDB_STEP_KEY)
            self._run.define_metric("*", step_metric=WANDB_STEP_KEY)
        except Exception as err:  # any failure at all: W&B must never fail a run
            self._disable("cannot start", err)

    @property
    def enabled(self) -> bool:
        return self._run is not None

    def _disable(self, what: str, err: Exception, finish: bool = True) -> None:
        log.warning("wandb: %s (%s: %s); W&B logging is off for this run, the other "
                    "writers go on", what, type(err).__name__, err)
        run, self._run = self._run, None
        if run is not None and finish:
            try:
                run.finish(exit_code=1)
            except Exception:
                log.debug("wandb: finish after a failure failed too", exc_info=True)

    def write(self, scope: str, step: int, wall_time: float,
              scalars: Mapping[str, float]) -> None:
        if self._run is None:
            return
        try:
            self._run.log({**scalars, WANDB_STEP_KEY: step})
        except Exception as err:
            self._disable("cannot log", err)

    def video(self, tag: str, step: int, mp4: Path, gif: bytes | None, fps: int) -> None:
        if self._run is None:
            return
        try:
            import wandb

            self._run.log({tag: wandb.Video(str(mp4), format="mp4"), WANDB_STEP_KEY: step})
        except Exception as err:
            self._disable("cannot log a video", err)

    def histograms(self, step: int, histograms: Mapping[str, Any]) -> None:
        if self._run is None:
            return
        try:
            import numpy as np
            import wandb

            self._run.log({**{f"hist/{name}": wandb.Histogram(np_histogram=(
                np.asarray(h.bucket_counts), np.asarray([h.min, *h.bucket_limits])))
                for name, h in histograms.items()}, WANDB_STEP_KEY: step})
        except Exception as err:
            self._disable("cannot log histograms", err)

    def flush(self) -> None:
        """W&B streams to its own service process; there is nothing to flush here."""

    def close(self) -> None:
        if self._run is None:
            return
        try:
            self._run.finish()
        except Exception as err:
            self._disable("cannot finish", err, finish=False)
        self._run = None
