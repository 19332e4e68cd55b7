"""Histograms of what the learner trains (`logging.histograms`): each trainable parameter's
values and its gradient from the update just made, the actions of that update's batch, and
Q(s, .) on its observations for a policy that gives them (`QValues`). DI-engine's gradient
and action loggers, for TensorBoard and W&B.

They are taken on the group's publisher once per `every_train_iterations`, right after an
update (so gradients are that update's), bucketed here with numpy into TensorBoard's form
(min, max, count, sum, sum of squares, each bucket's right edge and count), and ride in the
next learn-info report; the coordinator's logger writes them. Taking them costs a copy of the
weights to the host at that interval, nothing between. `Histograms` is the built-in hook.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from rlfleet.learner.hooks import HookContext, HookRunner, Order
from rlfleet.shared.algos.capabilities import QValues
from rlfleet.shared.contract.config import HistogramConfig
from rlfleet.shared.contract.wire.sampling import HistogramData

MAX_HISTOGRAMS = 64  # per report: the contract's bound (LearnInfo.histograms)


def histogram(values: torch.Tensor | np.ndarray, bins: int) -> HistogramData | None:
    """The finite values' histogram; None when there are none."""
    if isinstance(values, torch.Tensor):
        values = values.detach().float().cpu().numpy()
    v = np.asarray(values, dtype=np.float64).ravel()
    v = v[np.isfinite(v)]
    if not v.size:
        return None
    counts, edges = np.histogram(v, bins=bins)
    return HistogramData(min=float(v.min()), max=float(v.max()), num=float(v.size),
                         sum=float(v.sum()), sum_squares=float(np.dot(v, v)),
                         bucket_limits=edges[1:].tolist(), bucket_counts=counts.tolist())


def trainable_parameters(policy: Any) -> dict[str, nn.Parameter]:
    """The policy's trainable parameters by `<attribute>.<parameter>` (`q.net.0.weight`):
    its networks are attributes; frozen ones (target networks) are left out."""
    out: dict[str, nn.Parameter] = {}
    for name, module in vars(policy).items():
        if isinstance(module, nn.Module):
            for pname, p in module.named_parameters():
                if p.requires_grad:
                    out[f"{name}.{pname}"] = p
    return out


class HistogramTaker:
    def __init__(self, cfg: HistogramConfig | None) -> None:
        self.cfg = cfg
        self._last: int | None = None

    def due(self, train_iterations: int) -> bool:
        if self.cfg is None:
            return False
        return self._last is None or \
            train_iterations - self._last >= self.cfg.every_train_iterations

    def take(self, policy: Any, batch: Mapping[str, torch.Tensor]) -> dict[str, HistogramData]:
        """The histograms after an update on `batch`."""
        cfg = self.cfg
        assert cfg is not None
        self._last = int(policy.train_iterations)
        raw: dict[str, Any] = {}
        params = trainable_parameters(policy) if (cfg.weights or cfg.gradients) else {}
        for name, p in params.items():
            if cfg.weights:
                raw[f"weights/{name}"] = p
            if cfg.gradients and p.grad is not None:
                raw[f"gradients/{name}"] = p.grad
        if cfg.actions and "action" in batch:
            raw["actions"] = batch["action"]
        if cfg.q_values and isinstance(policy, QValues) and "obs" in batch:
            raw["q_values"] = policy.q_values(batch["obs"])
        out: dict[str, HistogramData] = {}
        for name, values in list(raw.items())[:MAX_HISTOGRAMS]:
            h = histogram(values, cfg.bins)
            if h is not None:
                out[name] = h
        return out


class Histograms:
    """The built-in hook (`logging.histograms`): after an update, when due, on the group's
    publisher, into the next report. Its state is when it last took them."""

    def __init__(self, cfg: HistogramConfig, outbox: Any, session: Any) -> None:
        self.taker = HistogramTaker(cfg)
        self.outbox = outbox
        self.session = session

    def register(self, runner: HookRunner) -> None:
        runner.register_op("after_iter", self._after_iter, Order.HISTOGRAMS)
        runner.register_state("histograms", self)

    def _after_iter(self, ctx: HookContext) -> None:
        if self.session.is_publisher and self.taker.due(ctx.train_iterations) \
                and ctx.batch is not None:
            self.outbox.histograms = self.taker.take(ctx.policy, ctx.batch)

    def state_dict(self) -> dict[str, Any]:
        return {"last": self.taker._last}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.taker._last = state.get("last")
