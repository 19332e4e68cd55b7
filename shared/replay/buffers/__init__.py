"""Replay buffers owned by the coordinator: uniform, prioritized, episode (sequences),
sequence (prioritized, overlapping, padded sequences: R2D2), queue.

`make_buffer` builds one from its config; `ChunkRegistry` counts how many buffers refer to
each chunk, so a chunk is deleted from storage exactly when the last buffer lets go of it.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable

from rlfleet.shared.contract.config import BufferConfig
from rlfleet.shared.replay.buffers.base import Buffer, ChunkInfo, SampleError, SampleRefs
from rlfleet.shared.replay.buffers.episode import EpisodeBuffer
from rlfleet.shared.replay.buffers.queue import QueueBuffer
from rlfleet.shared.replay.buffers.ratelimit import RateLimiter
from rlfleet.shared.replay.buffers.ring import PrioritizedBuffer, UniformBuffer
from rlfleet.shared.replay.buffers.sequence import SequenceBuffer


def make_buffer(name: str, cfg: BufferConfig, seed: int, priority_eps: float = 1e-6) -> Buffer:
    if cfg.kind == "uniform":
        return UniformBuffer(name, cfg.capacity, seed, replacement=cfg.replacement,
                             sample_range=cfg.sample_range)
    if cfg.kind == "prioritized":
        return PrioritizedBuffer(name, cfg.capacity, seed, alpha=cfg.alpha, beta=cfg.beta,
                                 beta_final=cfg.beta_final,
                                 beta_anneal_iterations=cfg.beta_anneal_iterations,
                                 priority_eps=priority_eps)
    if cfg.kind == "episode":
        return EpisodeBuffer(name, cfg.capacity, seed, sequence_length=cfg.sequence_length)
    if cfg.kind == "sequence":
        return SequenceBuffer(name, cfg.capacity, seed, sequence_length=cfg.sequence_length,
                              sequence_overlap=cfg.sequence_overlap, alpha=cfg.alpha,
                              beta=cfg.beta, beta_final=cfg.beta_final,
                              beta_anneal_iterations=cfg.beta_anneal_iterations,
                              priority_eps=priority_eps)
    if cfg.kind == "queue":
        return QueueBuffer(name, cfg.capacity, seed, max_policy_lag=cfg.max_policy_lag)
    if cfg.kind == "dataset":
        raise ValueError(f"buffers.{name}: dataset buffers are loaded by "
                         "rlfleet.shared.replay.datasets")
    raise ValueError(f"buffers.{name}.kind={cfg.kind!r} is not a buffer kind")


def make_limiter(cfg: BufferConfig) -> RateLimiter:
    r = cfg.rate_limit
    return RateLimiter(min_size=r.min_size, samples_per_insert=r.samples_per_insert,
                       error_buffer=r.error_buffer, min_lead=r.min_lead)


class ChunkRegistry:
    """chunk id -> number of buffers that refer to it, plus the ids released lately: a
    collector's retried report of a chunk that was already evicted and deleted must not be
    indexed again (its bytes are gone). A collector resends an unanswered report within
    seconds (its backoff tops out at 2 s), so ids released in the last `remember_s` (10
    minutes), at most `remember_released` of them, are remembered: a fast run's window fills
    in minutes and then stays at about 2 MB, however long the run."""

    def __init__(self, remember_released: int = 25_000, remember_s: float = 600.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.refs: dict[str, int] = {}
        self._released: OrderedDict[str, float] = OrderedDict()  # id -> when, oldest first
        self._remember = remember_released
        self._remember_s = remember_s
        self._clock = clock

    def __contains__(self, chunk_id: str) -> bool:
        return chunk_id in self.refs

    def seen(self, chunk_id: str) -> bool:
        """Held now, or released not long ago."""
        return chunk_id in self.refs or chunk_id in self._released

    def __len__(self) -> int:
        return len(self.refs)

    def hold(self, chunk_id: str, buffers: int) -> None:
        self.refs[chunk_id] = self.refs.get(chunk_id, 0) + buffers

    def release(self, chunk_ids: Iterable[str]) -> list[str]:
        """Drop one reference each; returns the ids nobody refers to any more."""
        dead = []
        now = self._clock()
        for chunk_id in chunk_ids:
            n = self.refs.get(chunk_id, 0) - 1
            if n <= 0:
                self.refs.pop(chunk_id, None)
                dead.append(chunk_id)
                self._released[chunk_id] = now
                if len(self._released) > self._remember:
                    self._released.popitem(last=False)
            else:
                self.refs[chunk_id] = n
        released, horizon = self._released, now - self._remember_s
        while released and next(iter(released.values())) < horizon:
            released.popitem(last=False)
        return dead

    def remembered(self) -> int:
        """Released ids still remembered: what bounds the registry's memory."""
        return len(self._released)


__all__ = ["Buffer", "ChunkInfo", "ChunkRegistry", "EpisodeBuffer", "PrioritizedBuffer",
           "QueueBuffer", "RateLimiter", "SampleError", "SampleRefs", "SequenceBuffer",
           "UniformBuffer", "make_buffer", "make_limiter"]
