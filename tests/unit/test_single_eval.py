"""`rlfleet single` runs the evaluation its config asks for, as the cluster does (its
coordinator schedules them and its collector runs them): deterministic episodes, then (with
`eval.stochastic`, the default) the same episodes with the exploring policy. The
time-to-solve bench compares the two sides on the same work."""

from __future__ import annotations

import pytest

from rlfleet.shared.run.config import load_config
from rlfleet.single_process import run_single

from .helpers import REPO


def _cartpole(stochastic: bool, env_steps: int):
    """CartPole DQN evaluated every 512 env steps on 4 episodes, for `env_steps` steps."""
    return load_config(REPO / "configs" / "cartpole-dqn.yaml").with_overrides(
        eval={"every_env_steps": 512, "episodes": 4, "num_envs": 4, "stochastic": stochastic,
              "stop_value": None},
        stop={"max_env_steps": env_steps})


@pytest.mark.parametrize("stochastic", [True, False])
def test_single_evaluates_as_the_config_says(stochastic):
    result = run_single(_cartpole(stochastic, 6144))
    steps = [e["env_steps"] for e in result.evaluations]
    assert len(steps) >= 3 and steps == sorted(steps) and steps[0] >= 512, steps
    assert result.env_steps >= 6144 and not result.solved
    for e in result.evaluations:
        assert ("stochastic_return" in e) is stochastic, e
        if stochastic:  # CartPole pays 1 a step: a return is at least 1 and at most 500
            assert 1 <= e["stochastic_return"] <= 500


def test_a_stochastic_evaluation_is_reproducible_from_its_seed():
    """The stochastic episodes draw from the evaluation's seed, not from the stream the
    actor explores with: how often a run is evaluated never changes what it collects."""
    import numpy as np

    from rlfleet.shared.algos.registry import make_policy
    from rlfleet.shared.envs.make import make_vector_env, run_spec
    from rlfleet.shared.rollout.rollout import evaluate

    cfg = load_config(REPO / "configs" / "cartpole-dqn.yaml")
    policy = make_policy(cfg.algo.model_copy(update={"eval_epsilon": 0.5}), run_spec(cfg), 0)
    envs = make_vector_env(cfg.env, 4, 0)
    acting = policy.rng.bit_generator.state
    first = evaluate(envs, policy, 8, seed=7, deterministic=False)
    assert policy.rng.bit_generator.state == acting, "the acting stream was drawn from"
    policy.rng.random(5)  # the actor explores meanwhile
    again = evaluate(envs, policy, 8, seed=7, deterministic=False)
    other = evaluate(envs, policy, 8, seed=8, deterministic=False)
    assert first.returns == again.returns
    assert first.returns != other.returns
    assert np.isfinite(first.returns).all()
    envs.close()
