"""The off-policy and offline loops: update after update on batches sampled ahead.

Batches come from this generation's feed (a data process of the learner's own, or a prefetch
thread: `rlfleet.learner.feed`), a sample answer's worth at a time. With a small network
this loop runs thousands of updates a second, so an update does only what its hooks must:
priorities gathered, a version handed over when one is due, a report snapshot when one is
due. Publishing and reporting happen on threads of their own.
"""

from __future__ import annotations

import time
from typing import cast

import torch

from rlfleet.learner.feed.base import Feed
from rlfleet.learner.feed.dataproc import DataProcess
from rlfleet.learner.feed.obs_stats import ObsStats
from rlfleet.learner.feed.prefetch import InlineFeed, Prefetcher
from rlfleet.learner.group.member import GroupError
from rlfleet.learner.hooks import BuiltInHook
from rlfleet.learner.loops.base import TrainingLoop
from rlfleet.learner.observe.dataset_eval import DatasetScores
from rlfleet.learner.output.feedback import Priorities
from rlfleet.learner.output.publishing import Publishing
from rlfleet.learner.output.reporting import IntervalReporting
from rlfleet.learner.training import Training
from rlfleet.shared.batching.batching import Batch
from rlfleet.shared.batching.transforms import BatchTransforms
from rlfleet.shared.contract.wire.sampling import MixShare

GET_TIMEOUT_S = 0.5  # how long one wait for batches lasts before the loop looks around
WEIGHTS = "_importance_weights"  # a batch's weights travel to the device with its fields


class OffPolicyLoop(TrainingLoop):
    def built_ins(self) -> list[BuiltInHook]:
        t, learner = self.t, self.t.cfg.learner
        hooks = [*super().built_ins(), Priorities(t.outbox.priorities),
                 Publishing(t.publisher, t.session, t.timers, learner.publish_every,
                            learner.publish_min_interval_s),
                 IntervalReporting(t, learner.learn_info_interval_s)]
        if t.cfg.logging.batch_log is not None:
            hooks.append(t.outbox.batch_log)
        if t.cfg.eval.dataset is not None:
            hooks.append(DatasetScores(t.cfg, t.outbox, t.session))
        return hooks

    def run_generation(self) -> bool:
        t = self.t
        feed = t.progress.prefetcher = open_feed(t)
        t.publisher.use(feed.weight_sink(t.storage))
        try:
            while not t.ending() and not feed.stop_run.is_set():
                if feed.group_ended.is_set():  # what it still holds is not learned from:
                    if feed.broken:            # the other ranks may have moved on
                        raise GroupError(feed.broken)
                    return False
                if t.session.generation_moved():
                    return False
                started = time.perf_counter()
                batches = feed.get(timeout=GET_TIMEOUT_S)
                if not self.wait(started, batches) or batches is None:
                    continue
                with t.turns:
                    t.hooks.on_data(feed.take_moments())
                    self.learn_all(batches)
                    self.count_round()
                    t.hooks.after_round()
            return True
        finally:
            # Without waiting for a data process (it may be in a sample request for a
            # second): the final version and report go out first, stored by this process.
            t.publisher.use(None)
            feed.close(wait=False)

    def learn_all(self, batches: list[Batch]) -> None:
        """Learn on each batch while batch i+1 goes to the device (`staging.py`); stop at
        once when the run is over (the final version and report go out)."""
        stager = self.t.stager
        staged = stager.stage(with_weights(batches[0]))
        for i, batch in enumerate(batches):
            if self.t.ending():
                return
            data = stager.ready(staged)
            weights = data.pop(WEIGHTS, None)
            self.update(data, batch, weights)
            stager.done(staged)
            if i + 1 < len(batches):
                staged = stager.stage(with_weights(batches[i + 1]))


class OfflineLoop(OffPolicyLoop):
    """The same loop over data that is there before the run starts (datasets, a loaded
    buffer): no collector counts observations for it, so no statistics are merged."""

    def built_ins(self) -> list[BuiltInHook]:
        return [h for h in super().built_ins() if not isinstance(h, ObsStats)]


def with_weights(batch: Batch) -> dict[str, torch.Tensor]:
    """The tensors of one update, importance weights included."""
    if batch.weights is None:
        return batch.data
    return {**batch.data, WEIGHTS: batch.weights}


def open_feed(t: Training) -> Feed:
    """This generation's feed: a data process of the learner's own, or a thread
    (`learner.data_process`); the training thread itself where the learner shares its
    process with other roles (`Training.turns`). In a group of several, its requests name
    the generation, so the coordinator deals this rank its shard of each batch."""
    cfg, session = t.cfg, t.session
    assert session.assignment is not None
    mix = [MixShare(buffer=p.buffer, fraction=p.fraction) for p in cfg.learner.mix]
    generation = session.assignment.generation if session.world_size > 1 else None
    # n-step returns, hindsight relabelling, per-buffer rewards (shared/batching/transforms.py)
    transforms = BatchTransforms.from_config(
        cfg, seed=t.seed * 1009 + (session.assignment.rank or 0))
    worker_id = t.agent.worker_id
    assert worker_id is not None  # registered before its first task
    if cfg.learner.data_process:
        return DataProcess(
            t.agent.client.base_url, t.storage_url, cfg.name, worker_id,
            cfg.algo.batch_size, cfg.learner.batches_per_request,
            cfg.learner.prefetch_requests, cfg.learner.chunk_cache, mix=mix,
            group_generation=generation, transforms=transforms).start()
    feed = InlineFeed if t.turns.shared else Prefetcher
    # without `by_buffer` its answers are lists of Batch, as a Feed's are
    return cast(Feed, feed(
        t.agent.client, t.storage, worker_id, cfg.algo.batch_size,
        cfg.learner.batches_per_request, cfg.learner.chunk_cache, mix=mix,
        group_generation=generation, depth=cfg.learner.prefetch_requests,
        transforms=transforms).start())
