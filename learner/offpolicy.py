"""The off-policy training loop: update after update on batches sampled ahead of time.

Batches come from a data process of the learner's own (`learner/dataproc.py`) or a prefetch
thread (`learner/prefetch.py`), a sample response's worth at a time. With a small network
this loop runs thousands of updates a second, so an update does only what it must: learn,
gather new priorities, hand over a version when one is due, and snapshot a report when one is
due. Publishing and reporting happen on threads of their own (`Publisher`, `Reporter`).
"""

from __future__ import annotations

import time

import torch

from rlfleet.learner.dataproc import DataProcess
from rlfleet.learner.dataset_eval import DatasetScorer
from rlfleet.learner.group import GroupError
from rlfleet.learner.onpolicy import merge_obs_stats
from rlfleet.learner.prefetch import Prefetcher
from rlfleet.learner.reporter import Reporter
from rlfleet.learner.training import Training
from rlfleet.shared.algos.capabilities import NormalizesObservations
from rlfleet.shared.batching.batching import Batch
from rlfleet.shared.batching.transforms import BatchTransforms
from rlfleet.shared.contract.wire.sampling import MixShare
from rlfleet.shared.envs.make import run_spec

GET_TIMEOUT_S = 0.5  # how long one wait for batches lasts before the loop looks around


def run_off_policy(t: Training) -> bool:
    """Train until the run ends (True) or the generation does (False)."""
    cfg, policy, session, progress = t.cfg, t.policy, t.session, t.progress
    assert session.assignment is not None
    progress.prefetcher = prefetcher = open_feed(t)
    if isinstance(prefetcher, DataProcess):
        t.publisher.route(prefetcher.put_weights)
    reporter = Reporter(t.agent.client)
    interval = cfg.learner.learn_info_interval_s
    min_interval = cfg.learner.publish_min_interval_s
    publish_every = cfg.learner.publish_every
    # The assignment changes only between generations, on this thread.
    is_publisher = session.is_publisher
    closing, feedback, publisher, timers = t.closing, t.feedback, t.publisher, t.timers
    stager, gpu, window = t.stager, t.gpu, t.window
    hooks = t.hooks if t.hooks.per_update else None  # learner.hooks around each update
    histograms = cfg.logging.histograms is not None
    batch_log = t.batch_log if cfg.logging.batch_log is not None else None
    tracks_obs = isinstance(policy, NormalizesObservations) and policy.tracks_obs_stats
    scorer = (DatasetScorer(cfg, run_spec(cfg))
              if cfg.eval.dataset is not None and is_publisher else None)
    try:
        while not closing.is_set() and not prefetcher.stop_run.is_set():
            if reporter.stop_run.is_set():
                return True
            t.mark_best(reporter)
            if prefetcher.group_ended.is_set():  # what it still holds is not learned from:
                if prefetcher.broken:            # the other ranks may have moved on
                    raise GroupError(prefetcher.broken)
                return False
            if session.generation_moved():
                return False
            t0 = time.perf_counter()
            batches = prefetcher.get(timeout=GET_TIMEOUT_S)
            t1, c1 = time.perf_counter(), time.thread_time()
            timers.wait_s += t1 - t0
            if batches is None:
                t.shortage.waiting()
                continue
            t.shortage.fed()
            if tracks_obs:  # algo.obs_norm: the new chunks' counts, before they are learned
                merge_obs_stats(policy, prefetcher.take_moments())
            # Batch i+1 goes to the device while the GPU computes update i (staging.py).
            staged = stager.stage(with_weights(batches[0]))
            for i, batch in enumerate(batches):
                if reporter.stop_run.is_set() or closing.is_set():
                    return True  # the run is over: publish and report at once
                data = stager.ready(staged)
                weights = data.pop(WEIGHTS, None)
                gpu.start()
                if hooks is not None:
                    hooks.before_iter(data)
                out = policy.learn(data, weights)
                logged = batch_log is not None and batch_log.due(policy.train_iterations)
                if hooks is not None:
                    hooks.after_iter(out.metrics, out.sample_values, logged)
                if logged and batch_log is not None:
                    batch_log.take(policy.train_iterations, batch, out.sample_values)
                if histograms:
                    t.maybe_histograms(data)
                gpu.end()
                stager.done(staged)
                if i + 1 < len(batches):
                    staged = stager.stage(with_weights(batches[i + 1]))
                window.add(out.metrics)
                if batch.item_refs and out.priorities is not None:
                    feedback.add(batch, out.priorities)
                if is_publisher and policy.train_iterations % publish_every == 0 and \
                        publisher.due(min_interval):
                    t.publish(wait=False)
                progress.train_iterations = policy.train_iterations
                if scorer is not None and scorer.due(policy.train_iterations):
                    t.dataset_scores = scorer.score(policy, policy.train_iterations)
                # Within a response too: with a large network one response is seconds of
                # updates, and progress (and priorities) should not wait for its end.
                if reporter.due(interval):
                    t.take_metrics()
                    reporter.send(t.learn_info())
            timers.count_update(t1, c1)
            t.maybe_checkpoint()
        return True
    finally:
        reporter.close()  # what it still holds goes out before the final report
        t.mark_best(reporter)
        # Without waiting for the data process (it may be in a sample request for a
        # second): the final version and report go out first, stored by this process.
        publisher.route(None)
        prefetcher.close(wait=False)


WEIGHTS = "_importance_weights"  # a batch's weights travel to the device with its fields


def with_weights(batch: Batch) -> dict[str, torch.Tensor]:
    """The tensors of one update, importance weights included."""
    if batch.weights is None:
        return batch.data
    return {**batch.data, WEIGHTS: batch.weights}


def open_feed(t: Training) -> Prefetcher | DataProcess:
    """This generation's source of ready batches: a data process of the learner's own, or
    a thread (`learner.data_process`). In a group of several, its requests name the
    generation, so the coordinator deals this rank its shard of each batch."""
    cfg, session = t.cfg, t.session
    assert session.assignment is not None
    mix = [MixShare(buffer=p.buffer, fraction=p.fraction) for p in cfg.learner.mix]
    generation = session.assignment.generation if session.world_size > 1 else None
    # n-step returns, hindsight relabelling, per-buffer rewards (shared/batching/transforms.py)
    transforms = BatchTransforms.from_config(
        cfg, seed=t.seed * 1009 + (session.assignment.rank or 0))
    worker_id = t.agent.worker_id
    if cfg.learner.data_process:
        return DataProcess(
            t.agent.client.base_url, t.storage_url, cfg.name, worker_id,
            cfg.algo.batch_size, cfg.learner.batches_per_request,
            cfg.learner.prefetch_requests, cfg.learner.chunk_cache, mix=mix,
            group_generation=generation, transforms=transforms).start()
    return Prefetcher(
        t.agent.client, t.storage, worker_id, cfg.algo.batch_size,
        cfg.learner.batches_per_request, cfg.learner.chunk_cache, mix=mix,
        group_generation=generation, depth=cfg.learner.prefetch_requests,
        transforms=transforms).start()
