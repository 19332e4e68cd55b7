"""New priorities gathered between two learn-info reports, sent as one update per buffer;
`Priorities` is the built-in hook that gathers them after each update."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import torch

from rlfleet.learner.hooks import HookContext, HookRunner, Order
from rlfleet.shared.batching.batching import Batch
from rlfleet.shared.contract.wire.sampling import PriorityUpdate


class PriorityFeedback:
    """Priorities stay tensors (on the learner's device) until a report takes them: reading
    a GPU tensor waits for the update that made it, so one read per report, not one per
    update, keeps the GPU fed."""

    def __init__(self, max_items: int = 500_000) -> None:
        self.max_items = max_items
        self._ids: dict[str, list[np.ndarray]] = defaultdict(list)
        self._values: dict[str, list[torch.Tensor]] = defaultdict(list)
        self._n = 0

    def add(self, batch: Batch, td_abs: torch.Tensor) -> None:
        values = td_abs.detach()
        for buffer, ids, part in batch.item_refs:
            if self._n >= self.max_items:  # the coordinator is unreachable: keep the newest
                self._ids.clear()
                self._values.clear()
                self._n = 0
            self._ids[buffer].append(ids)
            self._values[buffer].append(values[part])
            self._n += len(ids)

    def take(self) -> list[PriorityUpdate]:
        return updates_from(self.take_arrays())

    def take_arrays(self) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """What was gathered, as arrays per buffer (cheap: the training thread calls this;
        `updates_from` turns it into the request body on the reporting thread)."""
        out = {b: (np.concatenate(ids),
                   torch.cat(self._values[b]).float().cpu().numpy())
               for b, ids in self._ids.items()}
        self._ids.clear()
        self._values.clear()
        self._n = 0
        return out


def updates_from(arrays: dict[str, tuple[np.ndarray, np.ndarray]]) -> list[PriorityUpdate]:
    return [PriorityUpdate(buffer=b, item_ids=ids.tolist(), priorities=values.tolist())
            for b, (ids, values) in arrays.items()]


class Priorities:
    """The built-in hook of prioritized sampling: an update's new priorities (the policy's
    `LearnOutput.priorities`, one per row) for the items it learned from."""

    def __init__(self, feedback: PriorityFeedback) -> None:
        self.feedback = feedback

    def register(self, runner: HookRunner) -> None:
        runner.register_op("after_iter", self._after_iter, Order.PRIORITIES)

    def _after_iter(self, ctx: HookContext) -> None:
        batch, out = ctx.sampled, ctx.out
        if batch is not None and batch.item_refs and out.priorities is not None:
            self.feedback.add(batch, out.priorities)
