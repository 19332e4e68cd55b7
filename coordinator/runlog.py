"""Feeding the run's one logger from what workers report.

Collectors report finished episodes and timers with their chunk metadata, the learner its
metrics and timers with learn-info, collectors their evaluations; the scheduler adds buffer,
counter and cluster figures. Between two written records of a scope the figures accumulate
here (episodes since the last `collect` record, mean timers since the last `update` record),
so a record summarises its whole interval rather than sampling one report. The x-axis of
every scope is the run's env step count.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from rlfleet.coordinator.records import RecordFeed
from rlfleet.shared.contract.wire.evaluation import EvaluationResult
from rlfleet.shared.contract.wire.experience import ChunkMeta
from rlfleet.shared.contract.wire.sampling import LearnInfo
from rlfleet.shared.run.config import RunConfig
from rlfleet.shared.telemetry.rundata import JSONL_NAME

if TYPE_CHECKING:  # tensorboard is a heavy import: only with a run
    from rlfleet.shared.telemetry.logger import RunLogger

log = logging.getLogger("rlfleet.coordinator")


class _Means:
    """Running sums per key, emptied when read."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = defaultdict(float)
        self.counts: dict[str, int] = defaultdict(int)

    def add(self, values: Mapping[str, float], prefix: str) -> None:
        for key, value in values.items():
            self.sums[prefix + key] += float(value)
            self.counts[prefix + key] += 1

    def means(self) -> dict[str, float]:
        return {k: self.sums[k] / self.counts[k] for k in self.sums if self.counts[k]}

    def clear(self) -> None:
        self.sums.clear()
        self.counts.clear()


class _TrainWindow:
    """The learner reports between two written train records: each metric's mean weighted
    by how many values each report's mean is of, its min and max, and the last array of each
    array metric. A record then says what the whole interval did, not what its last
    minibatch happened to give."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        """Start the next interval (a train record was written)."""
        self.sums: dict[str, float] = defaultdict(float)
        self.counts: dict[str, int] = defaultdict(int)
        self.low: dict[str, float] = {}
        self.high: dict[str, float] = {}
        self.arrays: dict[str, list[float]] = {}

    def add(self, req: LearnInfo) -> None:
        for key, mean in req.metrics.items():
            n = max(1, req.metric_counts.get(key, 1))
            self.sums[key] += mean * n
            self.counts[key] += n
            low, high = req.metrics_min.get(key, mean), req.metrics_max.get(key, mean)
            self.low[key] = min(self.low.get(key, low), low)
            self.high[key] = max(self.high.get(key, high), high)
        self.arrays.update(req.arrays)

    def scalars(self, min_max: bool) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, total in self.sums.items():
            out[f"train/{key}"] = total / self.counts[key]
            if min_max:
                out[f"train/{key}_min"] = self.low[key]
                out[f"train/{key}_max"] = self.high[key]
        out.update({f"train/{k}": v for k, v in self.arrays.items()})
        return out


class RunLog:
    """The run's records go to the logger from `open(resume_step)` on: a resumed run's
    records continue from the step its snapshot was taken at, which the coordinator knows
    only once it has restored, so it builds its run log first and opens it after the
    restore (`open_logger=False`). Records reported before then are dropped; the coordinator
    opens it before it serves any request."""

    def __init__(self, cfg: RunConfig, run_dir: Path | None, resume_step: int | None = None,
                 *, open_logger: bool = True) -> None:
        self.cfg = cfg
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.logger: RunLogger | None = None
        self._lock = threading.Lock()
        self._returns: list[float] = []
        self._lengths: list[int] = []
        self._components: list[list[float]] = []
        self._lags: list[int] = []  # policy lag of each chunk since the last collect record
        self._timers = _Means()
        self._train = _TrainWindow()
        train_scope = cfg.logging.scopes.get("train")
        self._train_every = train_scope.every_train_iterations if train_scope else 0
        self._train_min_max = bool(train_scope and train_scope.min_max)
        self._train_written_at: int | None = None  # train iteration of the last train record
        self._force: set[str] = set()
        # The record each windowed scope would write now, with its step, while its interval
        # holds it back: `close` writes them, so a run's last stretch is in its curves.
        self._pending: dict[str, tuple[int, dict[str, Any]]] = {}
        # A run that collects nothing (offline: dataset buffers only) counts no env steps;
        # its records are stepped by train iterations instead, which do advance.
        self.offline = not cfg.receiving_buffers
        self._iterations = 0
        self.feed = RecordFeed()  # the records again, for the dashboard's live curves
        if open_logger:
            self.open(resume_step)

    def open(self, resume_step: int | None) -> None:
        """Open the run's logger: a fresh run (`resume_step` None) discards the records an
        earlier run left in the run directory; a resumed one keeps those up to its step."""
        # After a resume each scope writes its first record at once, so the gap the restart
        # left in a curve is as short as the snapshot allows.
        self._force = set(("collect", "train", "update", "info")) if resume_step else set()
        if self.run_dir is None:
            return
        from rlfleet.shared.telemetry.logger import (
            RunLogger,  # tensorboard is a heavy import: only with a run
        )

        cfg = self.cfg
        self.logger = RunLogger(self.run_dir, cfg.logging, cfg.name,
                                cfg.model_dump(mode="json"), resume_step=resume_step)
        if resume_step is not None and cfg.logging.jsonl:
            # The records the resumed run kept (the logger has just cut metrics.jsonl back
            # to the snapshot): the page draws the curve from the start, not from the crash.
            self.feed.seed(self.run_dir / JSONL_NAME)
        self.logger.add_writer(self.feed)

    def _log(self, scope: str, step: int, scalars: Mapping[str, Any],
             force: bool = False) -> bool:
        if self.logger is None:
            return False
        if self.offline:
            step = self._iterations
        try:
            written = self.logger.log(scope, step, scalars,
                                      force=force or scope in self._force)
            if written:
                self._force.discard(scope)
            return written
        except Exception:  # the run goes on without one record; the operator sees why
            log.exception("could not log %s at step %d", scope, step)
            return False

    def on_chunks(self, fresh: Iterable[ChunkMeta], env_steps: int,
                  steps_per_s: float, policy_version: int = -1) -> None:
        """`policy_version`: the learner's latest version as the coordinator knows it, for
        `collect/policy_lag` (versions between it and the one that acted in a chunk)."""
        with self._lock:
            for c in fresh:
                self._returns.extend(c.episode_returns)
                self._lengths.extend(c.episode_lengths)
                self._components.extend(c.episode_return_components)
                self._timers.add(c.timers, "timers/collector/")
                if policy_version >= 0 and c.policy_version >= 0:
                    self._lags.append(max(0, policy_version - c.policy_version))
            if not self._returns:
                return  # nothing finished yet: no collect record without episodes
            r = np.asarray(self._returns)
            scalars = {"collect/return_min": r.min(), "collect/return_mean": r.mean(),
                       "collect/return_max": r.max(),
                       "collect/episode_length": float(np.mean(self._lengths)),
                       "collect/episodes": float(len(r)),
                       "collect/env_steps_per_s": steps_per_s}
            if self._components:
                comps = np.asarray(self._components, dtype=np.float64)
                for i in range(comps.shape[1]):
                    scalars[f"collect/return_component_{i}_mean"] = comps[:, i].mean()
            if self._lags:
                scalars["collect/policy_lag"] = float(np.mean(self._lags))
            if self._log("collect", env_steps, scalars):
                self._returns, self._lengths, self._components = [], [], []
                self._lags = []
                self._pending.pop("collect", None)
            else:
                self._pending["collect"] = (env_steps, scalars)

    def on_learn_info(self, req: LearnInfo, env_steps: int, iterations_per_s: float,
                      nonfinite_total: int = 0) -> None:
        """`nonfinite_total`: the run's NaN or infinite learner values so far
        (`coordinator/health.py`), a curve of its own."""
        with self._lock:
            self._timers.add(req.timers, "timers/learner/")
            self._train.add(req)
            self._iterations = max(self._iterations, req.train_iterations)
            scalars = self._train.scalars(self._train_min_max)
            scalars["train/train_iterations"] = float(req.train_iterations)
            scalars["train/updates_per_s"] = iterations_per_s
            scalars["train/nonfinite_metrics"] = float(nonfinite_total)
            # The metric evaluator's scores ride in the train record, written whatever the
            # scope's interval: the eval scope's steps belong to env evaluations, which
            # arrive later than the train iteration they evaluated.
            scalars.update({f"eval/dataset/{k}": v for k, v in req.dataset_eval.items()})
            force = bool(req.dataset_eval)
            held = False
            if self._train_every:  # logging.scopes.train.every_train_iterations
                last = self._train_written_at
                due = last is None or self._iterations - last >= self._train_every
                held = not (due or force)
                force = True
            if not held and self._log("train", env_steps, scalars, force=force):
                self._train.clear()
                self._train_written_at = self._iterations
                self._pending.pop("train", None)
            else:
                self._pending["train"] = (env_steps, scalars)
            if self._log("update", env_steps, self._timers.means()):
                self._timers.clear()
        if req.histograms and self.logger is not None:  # logging.histograms
            self.logger.histograms(self._iterations if self.offline else env_steps,
                                   req.histograms)

    def on_evaluation(self, result: EvaluationResult) -> None:
        scalars: dict[str, float] = {"eval/policy_version": float(result.policy_version),
                                     "eval/train_iterations": float(result.train_iterations)}
        for mode in ("deterministic", "stochastic"):
            summary = getattr(result, mode)
            if summary is not None:
                # success_rate is None for envs that report no success: not logged
                scalars.update({f"eval/{mode}/{k}": float(v)
                                for k, v in summary.model_dump(exclude={"info"}).items()
                                if v is not None})
                scalars.update({f"eval/{mode}/info/{k}": v for k, v in summary.info.items()})
        for key, rates in result.battles.items():  # self-play: eval/vs_bot-random/win, ...
            opponent, _, seat = key.partition("/")
            prefix = f"eval/vs_{opponent}/" + (f"{seat}/" if seat else "")
            scalars.update({prefix + k: float(v) for k, v in rates.items() if k != "games"})
        with self._lock:
            self._log("eval", result.env_steps, scalars)

    def on_video(self, tag: str, step: int, mp4: Path, gif: bytes | None, fps: int) -> None:
        if self.logger is not None:
            self.logger.video(tag, step, mp4, gif, fps)

    def on_tick(self, env_steps: int, scalars: Mapping[str, float]) -> None:
        with self._lock:
            self._log("info", env_steps, scalars)

    def close(self) -> None:
        """Write what the intervals held back (the train window since its last record, the
        episodes since the last collect record), then close the logger: a run that stops
        between two records still shows how it ended."""
        with self._lock:
            for scope, (step, scalars) in self._pending.items():
                self._log(scope, step, scalars, force=True)
            self._pending.clear()
            if self.logger is not None:
                try:
                    self.logger.close()
                except Exception:
                    log.exception("closing the run logger failed")
