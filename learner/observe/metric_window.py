"""The updates' metrics between two learn-info reports, as one report's worth.

A policy's `learn` returns its metrics as 0-d tensors (an `.item()` per update would cost a
device sync each), sometimes plain floats, and sometimes arrays (a Q-value per action, a
histogram's counts). The learner reports about ten times a second while it may learn
thousands of times, so a report that carried only the last update's loss would be a sample,
not the interval's figure. `MetricWindow` keeps every update's values until the report and
then reduces them per key in one go: the mean, min and max of the finite values and how many
there were, so the coordinator can weight reports into the logging interval's mean.

A NaN or an infinity is dropped per value and counted per key (`nonfinite`), with one
warning per key for the learner's lifetime: one bad value must neither fail the report's
validation (it carries finite numbers only) nor hide the key's other values. Arrays are kept
as the interval's last one, finite elements only; the run logger reduces or drops them
(`logging.scopes.train.arrays`).
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

log = logging.getLogger("rlfleet.learner")

MAX_ARRAY_METRICS = 16  # keys per report: the contract's bound (LearnInfo.arrays)
MAX_ARRAY_ELEMENTS = 4096  # elements per array: larger ones are cut to this many
FOLD_AT = 512  # updates held before they are reduced into running figures


@dataclass(slots=True)
class MetricStats:
    """One key's finite values over an interval."""

    mean: float
    min: float
    max: float
    count: int


@dataclass(slots=True)
class WindowReport:
    """A report's metrics: per-key figures, the last array of each array key, and how many
    non-finite values each key had since the last report."""

    stats: dict[str, MetricStats] = field(default_factory=dict)
    arrays: dict[str, list[float]] = field(default_factory=dict)
    nonfinite: dict[str, int] = field(default_factory=dict)

    def means(self) -> dict[str, float]:
        return {k: s.mean for k, s in self.stats.items()}


class _Running:
    """A key's reduced figures so far."""

    __slots__ = ("total", "low", "high", "count")

    def __init__(self) -> None:
        self.total, self.low, self.high, self.count = 0.0, math.inf, -math.inf, 0

    def add(self, total: float, low: float, high: float, count: int) -> None:
        self.total += total
        self.low, self.high = min(self.low, low), max(self.high, high)
        self.count += count


class MetricWindow:
    """Collects update metrics on the training thread; `take()` reduces and empties it."""

    def __init__(self) -> None:
        self._pending: dict[str, list[Any]] = defaultdict(list)
        self._held = 0
        self._running: dict[str, _Running] = {}
        self._arrays: dict[str, np.ndarray] = {}
        self._nonfinite: dict[str, int] = defaultdict(int)
        self._warned: set[str] = set()
        self.nonfinite_total = 0  # over the learner's lifetime (`/status`)

    def add(self, metrics: Mapping[str, Any]) -> None:
        """One update's metrics; nothing is converted here (no device sync per update)."""
        for key, value in metrics.items():
            self._pending[key].append(value)
        self._held += 1
        if self._held >= FOLD_AT:
            self._fold()

    def take(self) -> WindowReport:
        """The interval's report; the window starts empty again."""
        self._fold()
        report = WindowReport(
            stats={k: MetricStats(r.total / r.count, r.low, r.high, r.count)
                   for k, r in self._running.items() if r.count},
            arrays={k: a.tolist() for k, a in list(self._arrays.items())[:MAX_ARRAY_METRICS]},
            nonfinite=dict(self._nonfinite))
        self._running, self._arrays = {}, {}
        self._nonfinite = defaultdict(int)
        return report

    # -- reducing -----------------------------------------------------------------------------

    def _fold(self) -> None:
        for key, values in self._pending.items():
            self._reduce(key, values)
        self._pending = defaultdict(list)
        self._held = 0

    def _reduce(self, key: str, values: list[Any]) -> None:
        scalars: list[float] = []
        tensors: list[torch.Tensor] = []
        for value in values:
            if isinstance(value, torch.Tensor):
                if value.dim() == 0:
                    tensors.append(value)
                elif value.numel() == 1:
                    tensors.append(value.reshape(()))
                else:
                    self._keep_array(key, value.detach().float().cpu().numpy())
            elif isinstance(value, (int, float, np.integer, np.floating)):
                scalars.append(float(value))
            elif isinstance(value, (np.ndarray, list, tuple)):
                array = np.asarray(value, dtype=np.float64)
                if array.size == 1:
                    scalars.append(float(array.reshape(())))
                else:
                    self._keep_array(key, array)
            else:
                self._warn(key, f"is not numeric ({type(value).__name__}): left out of reports")
        if tensors:  # one transfer for the interval's values, whatever their device
            scalars.extend(_stacked(tensors).detach().float().cpu().tolist())
        if not scalars:
            return
        array = np.asarray(scalars, dtype=np.float64)
        finite = array[np.isfinite(array)]
        bad = array.size - finite.size
        if bad:
            self._count_nonfinite(key, bad, array[~np.isfinite(array)][0])
        if finite.size:
            self._running.setdefault(key, _Running()).add(
                float(finite.sum()), float(finite.min()), float(finite.max()), finite.size)

    def _keep_array(self, key: str, array: np.ndarray) -> None:
        flat = array.astype(np.float64, copy=False).ravel()
        finite = flat[np.isfinite(flat)]
        if finite.size < flat.size:
            self._count_nonfinite(key, flat.size - finite.size, flat[~np.isfinite(flat)][0])
        self._arrays[key] = finite[:MAX_ARRAY_ELEMENTS]

    def _count_nonfinite(self, key: str, n: int, example: float) -> None:
        self._nonfinite[key] += n
        self.nonfinite_total += n
        self._warn(key, f"was not finite ({example}): such values are dropped from reports "
                   "and counted in train/nonfinite_metrics")

    def _warn(self, key: str, why: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning("metric %r %s (warned once per key)", key, why)


def _stacked(tensors: list[torch.Tensor]) -> torch.Tensor:
    """One tensor of a key's 0-d values: one stack where they agree on dtype and device (a
    cast per value would cost a torch call per update), each cast first where they do not."""
    first = tensors[0]
    if all(t.dtype == first.dtype and t.device == first.device for t in tensors):
        return torch.stack(tensors)
    return torch.stack([t.float().to(first.device) for t in tensors])
