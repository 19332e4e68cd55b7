"""The built-in algorithms and reward models: one line each.

Adding an algorithm is adding its folder (`rlfleet/shared/algos/<name>/`: `config.py`,
`policy.py`, and `SPEC` in `__init__.py`) and its line here; nothing else in the system
knows its rules (docs/algorithms/your-own.md walks through one).
"""

from __future__ import annotations

from typing import Any

from rlfleet.shared.algos import appo, bc, cql, dqn, ppo, r2d2, rnd, sac
from rlfleet.shared.algos.base import Policy
from rlfleet.shared.algos.capabilities import missing_policy_members
from rlfleet.shared.algos.spec import AlgoSpec, RewardModelSpec
from rlfleet.shared.contract.plugins import PluginKind, load_plugin
from rlfleet.shared.contract.spec import EnvSpec

ALGORITHMS: dict[str, AlgoSpec] = {spec.name: spec for spec in (
    dqn.SPEC,
    cql.SPEC,
    bc.SPEC,
    ppo.SPEC,
    appo.SPEC,
    sac.SPEC,
    r2d2.SPEC,
)}

REWARD_MODELS: dict[str, RewardModelSpec] = {spec.name: spec for spec in (
    rnd.SPEC,
)}


def algo_spec(name: str) -> AlgoSpec:
    """The spec of the algorithm `algo.name` names."""
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise ValueError(f"algo.name={name!r} is not one of {sorted(ALGORITHMS)}") from None


# A user's policy (`algo.policy`): a class with every member of `Policy`.
POLICY = PluginKind("Policy", extra_check=missing_policy_members,
                    subclass="rlfleet.Policy")


def policy_class(algo_cfg: Any) -> type:
    """The class a config's `algo` section names: `algo.policy` if set (checked to have the
    `Policy` members), else the built-in algorithm of `algo.name`."""
    if algo_cfg.policy:
        return load_plugin(algo_cfg.policy, "algo.policy", POLICY)
    return algo_spec(algo_cfg.name).policy_class()


def make_policy(algo_cfg: Any, spec: EnvSpec, seed: int) -> Policy:
    """The policy of a config's `algo` section, built for an env."""
    return policy_class(algo_cfg)(algo_cfg, spec, seed)
