"""The training loops, one per way of learning (`rlfleet.shared.algos.spec.Learning`): the
algorithm's spec picks its loop's type (`loop_for`). Each loop learns and keeps time; its
stages call the hooks, the learner's own features and the user's alike."""

from __future__ import annotations

from rlfleet.learner.loops.base import TrainingLoop
from rlfleet.learner.loops.off_policy import OfflineLoop, OffPolicyLoop
from rlfleet.learner.loops.on_policy import OnPolicyLoop
from rlfleet.learner.training import Training
from rlfleet.shared.algos.registry import algo_spec
from rlfleet.shared.algos.spec import Learning

LOOPS: dict[Learning, type[TrainingLoop]] = {
    Learning.ON_POLICY: OnPolicyLoop,
    Learning.OFF_POLICY: OffPolicyLoop,
    Learning.OFFLINE: OfflineLoop,
}


def learning_of(t: Training) -> Learning:
    """How the run's algorithm learns: its spec's word, or for a user's policy
    (`algo.policy`) what the policy says of itself."""
    if t.cfg.algo.policy is None:
        return algo_spec(t.cfg.algo.name).learning
    return Learning.of_policy(bool(t.policy.on_policy))


def loop_for(t: Training) -> TrainingLoop:
    """The loop of the run's kind, its hooks added (the user's: a `ConfigError` naming the
    one that cannot be made)."""
    return LOOPS[learning_of(t)](t)


__all__ = ["LOOPS", "OffPolicyLoop", "OfflineLoop", "OnPolicyLoop", "TrainingLoop",
           "learning_of", "loop_for"]
