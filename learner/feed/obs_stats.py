"""The observation statistics of a policy that normalises its observations (`algo.obs_norm`):
the counts collectors keep of each chunk's raw observations, merged into the statistics the
next published version carries, before the data is learned from."""

from __future__ import annotations

import logging
from typing import TypeGuard

from rlfleet.learner.hooks import HookContext, HookRunner, Order
from rlfleet.shared.algos.capabilities import NormalizesObservations

log = logging.getLogger("rlfleet.learner")


class ObsStats:
    """The built-in hook (`on_data`), for a policy whose statistics are on."""

    def __init__(self, policy: NormalizesObservations) -> None:
        self.policy = policy

    def register(self, runner: HookRunner) -> None:
        runner.register_op("on_data", self._merge, Order.OBS_STATS)

    def _merge(self, ctx: HookContext) -> None:
        """A malformed entry is skipped with a warning."""
        for entry in ctx.moments:
            try:
                self.policy.merge_obs_stats(entry)
            except (KeyError, TypeError, ValueError) as err:
                log.warning("observation moments skipped: %s", err)

    @staticmethod
    def wanted(policy: object) -> TypeGuard[NormalizesObservations]:
        return isinstance(policy, NormalizesObservations) and policy.tracks_obs_stats
