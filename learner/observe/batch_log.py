"""The learner's half of the batch log (`logging.batch_log`, docs/batch-log.md): the samples
of one update in `every_train_iterations`, named by (buffer, item id), with the per-sample
values the policy (`LearnOutput.sample_values`) and the hooks (`HookContext.add_log`) gave.

The coordinator counts every sample it hands out (coordinator/batch_log.py), so this side
only carries values: on a logged update it copies at most `samples_per_update` rows of each
value to the host (one transfer per value), and the rows ride in the next learn-info report.
Between logged updates it costs one integer comparison. What a report cannot carry (its
bound, `MAX_LOGGED_SAMPLES`) is dropped, oldest first, and counted.

`BatchLogging` is the built-in hook: before each update it tells the hooks whether the update
is logged (`ctx.logging_samples`), and after every hook it takes the rows.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from rlfleet.learner.hooks import HookContext, HookRunner, Order
from rlfleet.shared.batching.batching import Batch
from rlfleet.shared.contract.config import BatchLogConfig
from rlfleet.shared.contract.wire.sampling import (
    MAX_LOGGED_ENTRIES,
    MAX_LOGGED_SAMPLES,
    MAX_SAMPLE_VALUES,
    SAMPLE_VALUE_PATTERN,
    BatchLogEntry,
)

log = logging.getLogger("rlfleet.learner")

VALUE_NAME = re.compile(SAMPLE_VALUE_PATTERN)  # what the contract takes as a value's name


def _column(values: Any, rows: int) -> np.ndarray | None:
    """`values` as a float64 vector of the batch's `rows` values; None when it is not one
    value per row (a scalar, a per-sequence-step matrix): those cannot name a sample."""
    if isinstance(values, torch.Tensor):
        values = values.detach()
        if values.numel() != rows:
            return None
        return values.reshape(-1).to("cpu", torch.float64).numpy()
    arr = np.asarray(values, dtype=np.float64).reshape(-1)
    return arr if arr.size == rows else None


class BatchLogTaker:
    """Decides which updates are logged and keeps their rows until the next report."""

    def __init__(self, cfg: BatchLogConfig | None) -> None:
        self.cfg = cfg
        self.dropped = 0  # rows a report had no room for
        self._pending: list[BatchLogEntry] = []
        self._rows = 0
        self._skipped: set[str] = set()  # value names already warned about

    def register(self, runner: HookRunner) -> None:
        """As the built-in hook (`logging.batch_log`)."""
        runner.register_op("before_iter", self._flag, Order.BATCH_LOG_FLAG)
        runner.register_op("after_iter", self._take, Order.BATCH_LOG)

    def _flag(self, ctx: HookContext) -> None:
        ctx.logging_samples = self.due(ctx.train_iterations + 1)  # the update to come

    def _take(self, ctx: HookContext) -> None:
        if ctx.logging_samples and ctx.sampled is not None:
            self.take(ctx.train_iterations, ctx.sampled, ctx.sample_values)

    def due(self, train_iterations: int) -> bool:
        """Whether the update that makes `train_iterations` is one to log."""
        return self.cfg is not None and train_iterations % self.cfg.every_train_iterations == 0

    def take(self, train_iteration: int, batch: Batch, values: Mapping[str, Any]) -> None:
        """Log `batch`'s samples, part by part, with `values` (one per batch row each)."""
        assert self.cfg is not None
        rows = len(batch)
        columns: dict[str, np.ndarray] = {}
        for name, v in values.items():
            column = _column(v, rows) if VALUE_NAME.fullmatch(name) else None
            if column is None:
                if name not in self._skipped:
                    self._skipped.add(name)
                    log.warning("batch log: %r is not logged: a value's name must match %s "
                                "and it must hold one value per batch row (%d rows)",
                                name, VALUE_NAME.pattern, rows)
                continue
            columns[name] = column
            if len(columns) == MAX_SAMPLE_VALUES:
                break
        budget = self.cfg.samples_per_update
        for buffer, ids, span in batch.samples:
            n = min(int(ids.size), budget)
            if n <= 0:
                break
            budget -= n
            start = span.start or 0
            self._add(BatchLogEntry(
                train_iteration=train_iteration, buffer=buffer,
                item_ids=ids.reshape(-1)[:n].tolist(),
                values={name: [float(x) if np.isfinite(x) else None
                               for x in col[start:start + n]]
                        for name, col in columns.items()}))

    def _add(self, entry: BatchLogEntry) -> None:
        self._pending.append(entry)
        self._rows += len(entry.item_ids)
        while self._rows > MAX_LOGGED_SAMPLES or len(self._pending) > MAX_LOGGED_ENTRIES:
            gone = self._pending.pop(0)  # the report is late: the oldest rows go
            self._rows -= len(gone.item_ids)
            if not self.dropped:
                log.warning("batch log: more samples are logged than one learn-info report "
                            "carries (%d); the oldest are dropped: log fewer "
                            "(logging.batch_log.every_train_iterations, samples_per_update)",
                            MAX_LOGGED_SAMPLES)
            self.dropped += len(gone.item_ids)

    def take_pending(self) -> list[BatchLogEntry]:
        """The rows for the next report, handed over once."""
        out, self._pending, self._rows = self._pending, [], 0
        return out
