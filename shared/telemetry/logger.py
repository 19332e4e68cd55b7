"""The run logger: one per run, owned by the coordinator, fed from what workers report.

Because one process writes every record, a run has one set of curves however many workers it
has, and every record's x-value is the run's env step count. Each scope ("train", "collect",
"eval", "update", "info") is thinned by its own `every_env_steps`, so a chatty scope does not
bury a rare one. Values are cleaned here, once, for every writer: numbers become floats,
arrays are dropped or reduced to min/mean/max, and anything else is left out with one warning
per key (a bad metric must never stop training).

    with RunLogger(run_dir, cfg.logging, cfg.name, config=cfg.model_dump()) as logger:
        logger.log("train", env_steps, {"train/loss": loss, "train/q_mean": q.mean()})
        logger.log("eval", env_steps, eval_scalars, force=True)
"""

from __future__ import annotations

import json
import logging
import math
import numbers
import os
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from rlfleet.shared.contract.config import SCOPES, LoggingConfig, ScopeConfig
from rlfleet.shared.telemetry.log_writers import (
    TB_DIR,
    HistogramWriter,
    JsonlWriter,
    MetricWriter,
    TensorBoardWriter,
    VideoWriter,
    WandbWriter,
)
from rlfleet.shared.telemetry.plugins import shows, user_writers
from rlfleet.shared.telemetry.rundata import JSONL_NAME, RESERVED, read_records

log = logging.getLogger("rlfleet.logger")


def rewrite_jsonl_until(path: Path, resume_step: int) -> dict[str, int]:
    """Keep only the records at or before `resume_step` (the snapshot the run resumes from),
    atomically; return each scope's last kept step. Lines a SIGKILL truncated are dropped."""
    last: dict[str, int] = {}
    if not path.exists():
        return last
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as out:
        for record in read_records(path):
            if record["step"] <= resume_step:
                out.write(json.dumps(record) + "\n")
                last[record["scope"]] = max(record["step"], last.get(record["scope"], -1))
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)
    return last


class RunLogger:
    """Writes a run's records to every enabled writer; thread-safe (the coordinator logs from
    its request threads). `resume_step` continues a run from the snapshot taken at that env
    step: records after it are removed (JSONL) or hidden (TensorBoard), so no point appears
    twice; without it the run starts fresh and earlier records in `run_dir` are discarded."""

    def __init__(self, run_dir: Path, cfg: LoggingConfig, run_name: str,
                 config: dict | None = None, resume_step: int | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.cfg = cfg
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._scopes = {s: cfg.scopes.get(s, ScopeConfig()) for s in SCOPES}
        self._last_step: dict[str, int] = {}
        self._warned: set[str] = set()
        self._lock = threading.Lock()
        self._closed = False
        resume = resume_step is not None
        self._writers: list[MetricWriter] = []
        try:
            if cfg.jsonl:
                path = self.run_dir / JSONL_NAME
                if resume_step is not None:
                    self._last_step = rewrite_jsonl_until(path, resume_step)
                self._writers.append(JsonlWriter(path, append=resume))
            if cfg.tensorboard:
                tb_dir = self.run_dir / TB_DIR
                if not resume:  # a fresh run: the old curves go, as metrics.jsonl's records do
                    for old in tb_dir.glob("events.out.tfevents.*"):
                        old.unlink()
                self._writers.append(TensorBoardWriter(
                    tb_dir, purge_step=resume_step + 1 if resume_step is not None else None))
            if cfg.wandb.enabled:
                self._writers.append(WandbWriter(self.run_dir, cfg.wandb, run_name, config,
                                                 resume))
            self._writers.extend(user_writers(cfg, self.run_dir, run_name, config or {},
                                              resume))
        except BaseException:
            self._close_writers(report=False)
            raise

    # -- logging ------------------------------------------------------------------------------

    def log(self, scope: str, step: int, scalars: Mapping[str, Any], force: bool = False) -> bool:
        """Write one record of `scope` at env step `step` if its interval allows (or `force`);
        True if it was written. Steps must increase per scope: an older one is refused."""
        scope_cfg = self._scopes.get(scope)
        if scope_cfg is None:
            raise ValueError(f"unknown logging scope {scope!r}; scopes are {', '.join(SCOPES)}")
        step = int(step)
        with self._lock:
            if self._closed:
                return False
            last = self._last_step.get(scope)
            if last is not None and (step <= last or (
                    not force and step - last < scope_cfg.every_env_steps)):
                return False
            clean = self._clean(scope, scalars, scope_cfg)
            if not clean:  # nothing numeric: the interval is not used up by an empty record
                return False
            wall_time = time.time()
            for writer in self._writers:
                writer.write(scope, step, wall_time, clean)
            self._last_step[scope] = step
            return True

    def video(self, tag: str, step: int, mp4: Path, gif: bytes | None, fps: int) -> None:
        """Show a video (already in the run dir as `mp4`) in the writers that can
        (`VideoWriter`); one that fails is logged, never raised: a video must not fail a
        run."""
        for writer in self._writers_showing(VideoWriter):
            try:
                writer.video(tag, step, mp4, gif, fps)
            except Exception:
                log.exception("video not logged to %s", type(writer).__name__)

    def histograms(self, step: int, histograms: Mapping[str, Any]) -> None:
        """Histograms (`logging.histograms`: HistogramData by name) to the writers that
        show them (`HistogramWriter`: TensorBoard, W&B), as `hist/<name>`; one that fails
        is logged."""
        for writer in self._writers_showing(HistogramWriter):
            try:
                writer.histograms(int(step), histograms)
            except Exception:
                log.exception("histograms not logged to %s", type(writer).__name__)

    def _writers_showing(self, kind: type) -> list[Any]:
        """The open writers that show `kind`'s extra (optional to a writer)."""
        with self._lock:
            if self._closed:
                return []
            return [w for w in self._writers if shows(w, kind)]

    def add_writer(self, writer: MetricWriter) -> None:
        """One more destination for every record from now on (the coordinator's feed for
        live pages, added once it holds the history a resumed run kept)."""
        with self._lock:
            self._writers.append(writer)

    def last_step(self, scope: str) -> int | None:
        """The step of the scope's last written record (None before the first)."""
        return self._last_step.get(scope)

    def _clean(self, scope: str, scalars: Mapping[str, Any],
               scope_cfg: ScopeConfig) -> dict[str, float]:
        out: dict[str, float] = {}
        for key, value in scalars.items():
            key = str(key)
            if key in RESERVED:
                self._warn_once(key, scope, "is a reserved record field")
                continue
            number = _as_number(value)
            if number is None:
                self._warn_once(key, scope, f"is not numeric ({type(value).__name__})")
            elif isinstance(number, float):
                if math.isfinite(number):
                    out[key] = number
                else:
                    self._warn_once(key, scope, f"is not finite ({number})")
            elif scope_cfg.arrays == "minmeanmax" and number.size:
                finite = number[np.isfinite(number)]
                if finite.size:
                    out.update({f"{key}_min": float(finite.min()),
                                f"{key}_mean": float(finite.mean()),
                                f"{key}_max": float(finite.max())})
                else:
                    self._warn_once(key, scope, "has no finite element")
        return out

    def _warn_once(self, key: str, scope: str, why: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning("metric %r (scope %r) %s: left out of the logs (warned once per key)",
                        key, scope, why)

    # -- lifetime -----------------------------------------------------------------------------

    def flush(self) -> None:
        with self._lock:
            if not self._closed:
                for writer in self._writers:
                    writer.flush()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._close_writers()

    def _close_writers(self, report: bool = True) -> None:
        errors = []
        for writer in self._writers:
            try:
                writer.close()
            except Exception as err:  # close the others, then report
                errors.append(err)
        self._writers = []
        if errors and report:
            raise errors[0]

    def __enter__(self) -> RunLogger:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _as_number(value: Any) -> float | np.ndarray | None:
    """A float for a scalar (Python or numpy number, 0-d array or tensor), a float array for
    an array of any other shape, None for anything that is not numeric.

    A 1-element list or array stays an array, so a key's name (`x` or `x_mean`) does not
    depend on how many items one report happened to have."""
    if isinstance(value, numbers.Real):  # bool, int, float, numpy's numbers
        try:
            return float(value)
        except OverflowError:  # an int beyond float range
            return math.inf
    torch = sys.modules.get("torch")  # a tensor can only exist if torch is imported
    if torch is not None and isinstance(value, torch.Tensor):
        if value.is_complex():
            return None
        value = value.detach().to("cpu", torch.float64).numpy()
    if not isinstance(value, np.ndarray | np.generic | list | tuple):
        return None
    try:
        arr = np.asarray(value)
    except (ValueError, TypeError):  # ragged nesting
        return None
    if arr.dtype.kind not in "biuf":
        return None
    arr = arr.astype(np.float64)
    return arr.item() if arr.ndim == 0 else arr.ravel()
