"""Action masks in DQN and PPO: no illegal action is ever chosen, exploring or not, and
learning respects the masks (DQN's target max over legal next actions only, PPO's
log-probs as they were when acting, with no nan from the masked-out actions)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlfleet.shared.algos.dqn import DQN, masked_q
from rlfleet.shared.algos.dqn.config import DQNConfig
from rlfleet.shared.algos.ppo import PPO
from rlfleet.shared.algos.ppo.config import PPOConfig
from rlfleet.shared.contract.spec import EnvSpec

SPEC = EnvSpec(obs_shape=(3, 3, 2), n_actions=9)


def _masks(rng: np.random.Generator, n: int) -> np.ndarray:
    mask = rng.random((n, 9)) < 0.3
    mask[np.arange(n), rng.integers(9, size=n)] = True  # at least one legal action
    mask[0] = False
    mask[0, 8] = True  # exactly one, the last: a greedy argmax would rarely pick it
    return mask


def _policies():
    return [DQN(DQNConfig(hidden_sizes=(32,)), SPEC, seed=0),
            PPO(PPOConfig(hidden_sizes=(32,)), SPEC, seed=0)]


@pytest.mark.parametrize("policy", _policies(), ids=["dqn", "ppo"])
def test_no_illegal_action_is_chosen(policy):
    rng = np.random.default_rng(0)
    for step in (0, 5_000, 10**9):  # exploring fully, partly, not at all
        obs = rng.random((256, 3, 3, 2)).astype(np.float32)
        mask = _masks(rng, 256)
        for actions in (policy.act(obs, step, mask=mask).actions,
                        policy.act_eval(obs, True, mask=mask),
                        policy.act_eval(obs, False, mask=mask)):
            assert mask[np.arange(256), actions].all()
    assert policy.act(obs, 0).actions.max() < 9  # no mask: every action allowed


def test_dqn_targets_take_the_max_over_legal_next_actions_only():
    cfg = DQNConfig(hidden_sizes=(32,), gamma=0.9, target_update_every=1000)
    dqn = DQN(cfg, SPEC, seed=1)
    rng = np.random.default_rng(1)
    n = 64
    obs, next_obs = (torch.as_tensor(rng.random((n, 3, 3, 2)), dtype=torch.float32)
                     for _ in range(2))
    next_mask = torch.as_tensor(_masks(rng, n))
    batch = {"obs": obs, "next_obs": next_obs, "action": torch.as_tensor(rng.integers(9, size=n)),
             "reward": torch.ones(n), "terminated": torch.zeros(n, dtype=torch.bool),
             "next_action_mask": next_mask}
    with torch.no_grad():
        online = dqn.q(next_obs).masked_fill(~next_mask, float("-inf"))
        best = online.argmax(dim=1, keepdim=True)
        assert next_mask.gather(1, best).all()
        target = 1.0 + 0.9 * dqn.target(next_obs).gather(1, best).squeeze(1)
        q = dqn.q(obs).gather(1, batch["action"].unsqueeze(1)).squeeze(1)
        unmasked = 1.0 + 0.9 * dqn.target(next_obs).gather(
            1, dqn.q(next_obs).argmax(dim=1, keepdim=True)).squeeze(1)
    out = dqn.learn(batch)
    assert torch.allclose(out.priorities, (target - q).abs(), atol=1e-5)
    assert not torch.allclose(out.priorities, (unmasked - q).abs(), atol=1e-5)


def test_a_finished_games_empty_mask_leaves_the_row_alone():
    q = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    out = masked_q(q, np.array([[True, False], [False, False]]))
    assert out[0, 1] == float("-inf") and torch.equal(out[1], q[1])


def test_ppo_learns_from_masked_rollouts_without_nan():
    ppo = PPO(PPOConfig(hidden_sizes=(32,), batch_size=32, epochs=2), SPEC, seed=2)
    rng = np.random.default_rng(2)
    n = 128
    obs = rng.random((n, 3, 3, 2)).astype(np.float32)
    mask = _masks(rng, n)
    out = ppo.act(obs, 0, mask=mask)
    with torch.no_grad():  # the log-probs learning sees are the ones acting recorded
        head = ppo._masked(ppo.net.head(torch.as_tensor(obs)), mask)
        again, entropy = ppo.net.log_prob_entropy(head, torch.as_tensor(out.actions))
    assert torch.allclose(again, torch.as_tensor(out.extras["log_prob"]), atol=1e-5)
    assert torch.isfinite(entropy).all()
    cut = np.zeros(n, dtype=bool)
    cut[-1] = True
    batch = {"obs": torch.as_tensor(obs), "action": torch.as_tensor(out.actions),
             "reward": torch.as_tensor(rng.random(n), dtype=torch.float32),
             "terminated": torch.zeros(n, dtype=torch.bool), "cut": torch.as_tensor(cut),
             "log_prob": torch.as_tensor(out.extras["log_prob"]),
             "value": torch.as_tensor(out.extras["value"]),
             "bootstrap_value": torch.zeros(n), "action_mask": torch.as_tensor(mask)}
    metrics = ppo.learn(batch).metrics
    assert all(np.isfinite(float(v)) for v in metrics.values())


@pytest.mark.parametrize("policy", _policies(), ids=["dqn", "ppo"])
def test_policies_play_real_games_by_the_rules(policy):
    match = pytest.importorskip("rlfleet.shared.envs.games.match")
    pytest.importorskip("pettingzoo")
    env = match.make_game("tictactoe_v3")
    rng = np.random.default_rng(4)

    def actor(obs, mask):
        return int(policy.act(obs[None].astype(np.float32), 100, mask=mask[None]).actions[0])

    for seed in range(40):  # match.play raises GameError on any illegal action
        game = match.play(env, actor, match.random_actor(rng), seed % 2 == 0, seed)
        assert game.columns()["action_mask"][np.arange(len(game.action)), game.action].all()
