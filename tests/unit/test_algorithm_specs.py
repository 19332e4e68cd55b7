"""Algorithms describe themselves: every built-in one is a folder with a spec in the registry,
its spec says what its policy really is, and the run config, the launch check and the roles
read their rules from it."""

from __future__ import annotations

import subprocess
import sys
import typing

import pytest

from rlfleet.shared.algos.capabilities import (
    CAPABILITIES,
    capabilities_of,
    hook_problems,
    near_misses,
)
from rlfleet.shared.algos.registry import ALGORITHMS, REWARD_MODELS, make_policy
from rlfleet.shared.contract.config import ConfigError
from rlfleet.shared.contract.spec import EnvSpec
from rlfleet.shared.run.check import check_runnable
from rlfleet.shared.run.config import ALGO_NAMES, RunConfig, parse_config

DISCRETE = EnvSpec(obs_shape=(4,), n_actions=2)
CONTINUOUS = EnvSpec(obs_shape=(3,), action_shape=(1,), action_low=(-2.0,), action_high=(2.0,))


def _env_for(spec) -> EnvSpec:
    return DISCRETE if "discrete" in spec.action_spaces else CONTINUOUS


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_a_spec_says_what_its_policy_is(name):
    """The spec's capabilities are what `isinstance` finds on a built policy, its on-policy
    flag is the policy's own, and the policy's hooks have the signatures the roles call."""
    spec = ALGORITHMS[name]
    cls = spec.policy_class()
    assert spec.config().name == name
    assert cls.on_policy is spec.on_policy
    assert hook_problems(cls) == [] and near_misses(cls) == []
    spaces = {"discrete": DISCRETE, "continuous": CONTINUOUS}
    for env in (spaces[space] for space in sorted(spec.action_spaces)):
        policy = make_policy(spec.config(), env, 0)
        assert {c.__name__ for c in capabilities_of(policy)} == set(spec.capabilities)


@pytest.mark.parametrize("name", sorted(REWARD_MODELS))
def test_a_reward_model_spec_says_what_its_model_is(name):
    spec = REWARD_MODELS[name]
    model = spec.model_class()(DISCRETE, seed=0, **spec.config().model_dump())
    assert {c.__name__ for c in capabilities_of(model)} == set(spec.capabilities)


def test_the_run_config_knows_exactly_the_registered_algorithms():
    union = typing.get_args(RunConfig.model_fields["algo"].annotation)
    assert {c.model_fields["name"].default for c in union} == set(ALGORITHMS)
    assert tuple(ALGORITHMS) == ALGO_NAMES
    for name, spec in ALGORITHMS.items():
        assert type(parse_config({"algo": {"name": name}, **_feed(spec)}).algo) is spec.config


def test_capability_names_in_specs_are_capabilities():
    known = {c.__name__ for c in CAPABILITIES}
    for spec in [*ALGORITHMS.values(), *REWARD_MODELS.values()]:
        assert spec.capabilities <= known, spec.name


def _feed(spec) -> dict:
    """Buffers and a mix an algorithm can learn from."""
    if spec.on_policy:
        return {"buffers": {"q": {"kind": "queue"}},
                "learner": {"mix": [{"buffer": "q", "fraction": 1.0}]}}
    if "uniform" not in spec.buffer_kinds:  # R2D2: sequences
        kind = sorted(spec.buffer_kinds)[0]
        return {"buffers": {"replay": {"kind": kind, "sequence_length": 8}}}
    return {}


def test_feed_rules_come_from_the_spec():
    queue = {"buffers": {"q": {"kind": "queue"}},
             "learner": {"mix": [{"buffer": "q", "fraction": 1.0}]}}
    with pytest.raises(ConfigError, match="learner.mix: DQN samples transitions; queue "
                                          "buffer 'q' is for on-policy algorithms"):
        parse_config({"algo": {"name": "dqn"}, **queue})
    with pytest.raises(ConfigError, match="learner.mix: behaviour cloning samples"):
        parse_config({"algo": {"name": "bc"}, **queue})
    with pytest.raises(ConfigError, match="learner.mix: PPO learns from whole chunks of "
                                          "exactly one queue buffer"):
        parse_config({"algo": {"name": "ppo"}})
    parse_config({"algo": {"name": "ppo"}, **queue})


def test_an_algorithm_that_cannot_act_in_the_env_is_refused_at_launch_without_torch():
    cfg = parse_config({"env": {"id": "Pendulum-v1"}, "algo": {"name": "dqn"}})
    with pytest.raises(ConfigError, match="algo.name='dqn' needs a discrete action space"):
        check_runnable(cfg, build=False)


def test_checking_a_built_in_config_imports_no_torch():
    """The launcher checks a config from the specs: torch stays out of the process that
    forks every role."""
    code = ("import sys; from rlfleet.shared.run.config import load_config;"
            "from rlfleet.shared.run.check import check_runnable;"
            "check_runnable(load_config('cartpole-ppo'), build=False);"
            "import rlfleet.coordinator.app, rlfleet.collector.service;"
            "assert 'torch' not in sys.modules, 'torch was imported'")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr


def test_dataset_metrics_that_need_q_values_are_refused_for_algorithms_without_them(tmp_path):
    cfg = parse_config({"algo": {"name": "bc"}, "eval": {
        "dataset": {"path": str(tmp_path), "metric": "td_error"}}})
    from rlfleet.shared.run.check import _check_capabilities

    with pytest.raises(ConfigError, match="eval.dataset.metric=td_error: needs Q-values"):
        _check_capabilities(cfg, "behaviour cloning", set(ALGORITHMS["bc"].capabilities))
