"""The on-policy training loop: one update per rollout of whole chunks, then a version.

Each round gathers a rollout from a queue buffer (`learner/rollouts.py`; in a group, this
rank's share of the group's rollout), learns on it once, publishes, and reports the chunks it
consumed, so the data of every round was acted by the last few policy versions and the queue
releases what was used.
"""

from __future__ import annotations

import logging
import time

from rlfleet.learner.group import GroupError
from rlfleet.learner.rollouts import RolloutFeeder
from rlfleet.learner.training import Training
from rlfleet.shared.algos.base import Policy
from rlfleet.shared.algos.capabilities import NormalizesObservations
from rlfleet.shared.contract.algo import RolloutSettings

log = logging.getLogger("rlfleet.learner")


def run_on_policy(t: Training, buffer: str) -> bool:
    """Learn on rollouts from `buffer` until the run ends (True) or the generation does
    (False)."""
    cfg, policy, session, progress, timers = t.cfg, t.policy, t.session, t.progress, t.timers
    assignment = session.assignment
    assert assignment is not None
    grouped = session.world_size > 1
    if progress.feeder is not None and progress.feeder.consumed:  # the last generation's
        t.report(progress.feeder.take_consumed())
    progress.feeder = feeder = RolloutFeeder(
        t.agent.client, t.storage, t.agent.worker_id, buffer,
        rollout_size=cfg.rollout_rows,
        max_policy_lag=(cfg.algo.max_policy_lag if isinstance(cfg.algo, RolloutSettings)
                        else None),
        packed=t.placement.cuda)
    while not t.closing.is_set() and not feeder.stop_run:
        if feeder.broken:
            raise GroupError(feeder.broken)
        if feeder.group_ended or session.generation_moved():
            return False
        t0 = time.perf_counter()
        if grouped:
            rollout = feeder.next_share(assignment.generation, t.publisher.version)
        else:
            rollout = feeder.next(t.publisher.version)
        t1, c1 = time.perf_counter(), time.thread_time()
        timers.wait_s += t1 - t0
        if rollout is None:
            t.shortage.waiting()
            if feeder.consumed and t.report(feeder.take_consumed()):
                return True  # dropped chunks are reported even when no rollout filled
            continue
        t.shortage.fed()
        merge_obs_stats(policy, feeder.take_moments())
        data = t.stager.put(rollout.data)  # to the device, frames stacked there
        t.gpu.start()
        if t.hooks.per_update:
            t.hooks.before_iter(data)
        out = policy.learn(data)
        if t.hooks.per_update:
            t.hooks.after_iter(out.metrics)
        if t.cfg.logging.histograms is not None:
            t.maybe_histograms(data)
        t.gpu.end()
        if session.is_publisher:
            t.publish()
        progress.train_iterations = policy.train_iterations
        timers.count_update(t1, c1)
        progress.learn_rounds += 1
        t.maybe_checkpoint()
        t.window.add(out.metrics)
        t.take_metrics({"policy_lag_mean": rollout.lag_mean,
                        "policy_lag_max": float(rollout.lag_max),
                        "dropped_stale_chunks": float(feeder.dropped_chunks),
                        "dropped_stale_rows": float(feeder.dropped_rows),
                        "learn_rounds": float(progress.learn_rounds)})
        if t.report(feeder.take_consumed()):
            return True
    return True


def merge_obs_stats(policy: Policy, moments: list[dict]) -> None:
    """algo.obs_norm: the chunks' raw-observation counts, into the statistics the next
    published version carries; a malformed entry is skipped with a warning."""
    if not isinstance(policy, NormalizesObservations):
        return
    for entry in moments:
        try:
            policy.merge_obs_stats(entry)
        except (KeyError, TypeError, ValueError) as err:
            log.warning("observation moments skipped: %s", err)
