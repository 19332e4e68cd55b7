"""The feed of the off-policy and offline loops: batches sampled ahead, whoever samples them.

Two implementations stand behind it: a prefetch thread in the learner's own process
(`prefetch.py`, `learner.data_process: false`) and a data process of its own (`dataproc.py`,
the default). The loop never asks which one it has; it asks the feed for its next batches,
for the observation statistics of the chunks behind them, and where this generation's
policy versions are written (a data process writes them for the learner).
"""

from __future__ import annotations

import threading
from typing import Any, Protocol

from rlfleet.learner.output.publisher import WeightSink
from rlfleet.shared.batching.batching import Batch
from rlfleet.shared.infra.storage import Storage


class Feed(Protocol):
    """A generation's source of ready batches."""

    stop_run: threading.Event  # the coordinator said the run is over
    group_ended: threading.Event  # the learner group moved on: this feed is done
    broken: str | None  # why this rank must leave its generation itself (or None)
    fetch_s: float  # seconds spent reading chunks and assembling batches
    dropped_responses: int  # sample answers dropped (out of step, a chunk gone)

    def get(self, timeout: float) -> list[Batch] | None:
        """The next sample answer's batches, or None after `timeout` seconds without."""

    def take_moments(self) -> list[dict[str, Any]]:
        """The raw-observation statistics of the chunks read since the last call."""

    def weight_sink(self, storage: Storage) -> WeightSink:
        """Where this generation's policy versions are written."""

    def close(self, wait: bool = True) -> None:
        """Stop sampling; `wait=False` leaves the clean-up to a thread of its own."""
