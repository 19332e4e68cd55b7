"""Optional capabilities are types: what a policy implements is asked with `isinstance`, a
hook defined with the wrong signature or only in part is reported (and refused at launch),
a misspelt one is pointed out, and a reward model keeps its policy's capabilities."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlfleet.shared.algos.capabilities import (
    DataParallel,
    EpsilonGreedy,
    NormalizesObservations,
    Optimized,
    QValues,
    SeededActing,
    capabilities_of,
    class_capabilities,
    hook_problems,
    near_misses,
)
from rlfleet.shared.algos.dqn.config import DQNConfig
from rlfleet.shared.algos.ppo.config import PPOConfig
from rlfleet.shared.algos.registry import make_policy
from rlfleet.shared.algos.reward_model import with_reward_model
from rlfleet.shared.contract.config import ConfigError
from rlfleet.shared.contract.spec import EnvSpec
from rlfleet.shared.run.check import check_runnable
from rlfleet.shared.run.config import parse_config

USERLAND = Path(__file__).resolve().parents[1] / "userland"
REPO = Path(__file__).resolve().parents[2]
DISCRETE = EnvSpec(obs_shape=(4,), n_actions=2)


@pytest.fixture
def userland(monkeypatch):
    monkeypatch.syspath_prepend(str(USERLAND))
    import my_rl

    return my_rl


def test_the_built_in_policies_have_the_capabilities_they_say():
    dqn = make_policy(DQNConfig(), DISCRETE, 0)
    assert all(isinstance(dqn, c) for c in (DataParallel, SeededActing, Optimized, QValues,
                                            EpsilonGreedy))
    assert not isinstance(dqn, NormalizesObservations)
    ppo = make_policy(PPOConfig(), DISCRETE, 0)
    assert isinstance(ppo, NormalizesObservations) and not isinstance(ppo, QValues)
    assert not isinstance(ppo, EpsilonGreedy)


def test_a_hook_with_the_wrong_signature_is_reported_and_refused(userland):
    problems = hook_problems(userland.GroupDQNWithoutArgument)
    assert len(problems) == 1 and "set_reducer()" in problems[0] \
        and "DataParallel" in problems[0], problems
    cfg = parse_config({"env": {"id": "CartPole-v1"}, "algo": {
        "name": "dqn", "policy": "my_rl:GroupDQNWithoutArgument"}})
    with pytest.raises(ConfigError, match=r"algo.policy='my_rl:GroupDQNWithoutArgument': "
                                          r"GroupDQNWithoutArgument.set_reducer\(\)"):
        check_runnable(cfg)


def test_a_capability_defined_in_part_is_reported(userland):
    problems = hook_problems(userland.HalfNormalizingDQN)
    assert any("defines preprocess but not merge_obs_stats, tracks_obs_stats" in p
               for p in problems), problems
    assert NormalizesObservations not in class_capabilities(userland.HalfNormalizingDQN)


def test_a_misspelt_hook_is_pointed_out(userland):
    assert near_misses(userland.MisspeltHookDQN) == [
        "MisspeltHookDQN.merge_obs_stat: did you mean merge_obs_stats "
        "(NormalizesObservations)?"]
    checked = check_runnable(parse_config({"env": {"id": "CartPole-v1"}, "algo": {
        "name": "dqn", "policy": "my_rl:MisspeltHookDQN"}}))
    assert checked.warnings and "merge_obs_stats" in checked.warnings[0]


def test_rlfleet_check_prints_what_a_users_policy_implements(tmp_path):
    cfg = tmp_path / "mine.yaml"
    cfg.write_text("env: {id: 'my_rl:LineWalk'}\n"
                   "algo: {name: dqn, policy: 'my_rl:DuelingDQN', params: {tag: x}}\n"
                   "eval: {stop_value: 0.7}\n")
    env = {**os.environ, "PYTHONPATH": str(USERLAND)}
    done = subprocess.run([sys.executable, "-m", "rlfleet", "check", "--config", str(cfg)],
                          capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "my_rl:DuelingDQN implements Policy and DataParallel" in done.stdout
    assert "QValues" in done.stdout and f"{cfg}: ok" in done.stdout


def test_a_reward_model_keeps_the_policys_capabilities():
    algo = DQNConfig(reward_model={"path": "rnd"})
    wrapped = with_reward_model(make_policy(algo, DISCRETE, 0), algo, DISCRETE, 0)
    assert set(capabilities_of(wrapped)) == {DataParallel, SeededActing, Optimized, QValues,
                                             EpsilonGreedy}
    wrapped.set_epsilon(0.25)  # passed on to the policy
    assert wrapped.epsilon(0) == wrapped.policy.epsilon(10**6) == 0.25
    ppo_cfg = PPOConfig(obs_norm=True, reward_model={"path": "rnd"})
    ppo = with_reward_model(make_policy(ppo_cfg, DISCRETE, 0), ppo_cfg, DISCRETE, 0)
    assert isinstance(ppo, NormalizesObservations) and ppo.tracks_obs_stats
    assert not isinstance(ppo, QValues)
