"""DQN and PPO over stacked Atari frames: the field's networks, uint8 all the way to them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlfleet.shared.algos.dqn import DQN
from rlfleet.shared.algos.dqn.config import DQNConfig
from rlfleet.shared.algos.nets import NatureCNN, as_obs_tensor
from rlfleet.shared.algos.ppo import PPO
from rlfleet.shared.algos.ppo.config import PPOConfig
from rlfleet.shared.contract.spec import EnvSpec

PONG = EnvSpec(obs_shape=(4, 84, 84), n_actions=6)


def _frames(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, *PONG.obs_shape), dtype=np.uint8)


def test_the_nature_dqn_has_the_papers_shape():
    q = DQN(DQNConfig(), PONG, seed=0).q
    convs = [m for m in q.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [(c.out_channels, c.kernel_size, c.stride) for c in convs] == [
        (32, (8, 8), (4, 4)), (64, (4, 4), (2, 2)), (64, (3, 3), (1, 1))]
    linears = [m for m in q.modules() if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(3136, 512), (512, 6)]
    # conv 4*32*64+32, 32*64*16+64, 64*64*9+64; fc 3136*512+512; head 512*6+6
    assert sum(p.numel() for p in q.parameters()) == 1_687_206


def test_the_trunk_scales_uint8_itself():
    trunk = NatureCNN((4, 84, 84))
    frames = torch.from_numpy(_frames(3))
    torch.testing.assert_close(trunk(frames), trunk(frames.float() / 255.0))
    assert as_obs_tensor(_frames(2)).dtype == torch.uint8
    assert as_obs_tensor(np.zeros((2, 4), np.float64)).dtype == torch.float32


@pytest.mark.parametrize("algo", ["dqn", "ppo"])
def test_acting_on_frames_gives_legal_actions(algo):
    policy = (DQN(DQNConfig(eps_start=0.0, eps_end=0.0), PONG, seed=0) if algo == "dqn"
              else PPO(PPOConfig(), PONG, seed=0))
    out = policy.act(_frames(5), env_step=0)
    assert out.actions.shape == (5,) and ((out.actions >= 0) & (out.actions < 6)).all()
    assert policy.act_eval(_frames(5)).shape == (5,)
    mask = np.zeros((5, 6), bool)
    mask[:, 2] = True
    assert (policy.act(_frames(5), env_step=0, mask=mask).actions == 2).all()


def test_dqn_learns_from_a_uint8_batch():
    dqn = DQN(DQNConfig(lr=1e-3), PONG, seed=0)
    seen = []
    dqn.q.register_forward_pre_hook(lambda _m, args: seen.append(args[0].dtype))
    n = 32
    batch = {"obs": torch.from_numpy(_frames(n, 1)), "next_obs": torch.from_numpy(_frames(n, 2)),
             "action": torch.randint(0, 6, (n,)), "reward": torch.randn(n),
             "terminated": torch.zeros(n, dtype=torch.bool)}
    before = dqn.policy_state()
    out = dqn.learn(batch)
    assert all(np.isfinite(float(v)) for v in out.metrics.values())
    assert set(seen) == {torch.uint8}  # nothing upcast the frames before the network
    after = dqn.policy_state()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    fresh = DQN(DQNConfig(), PONG, seed=9)
    fresh.load_policy(1, after)
    frames = _frames(4, 3)
    np.testing.assert_array_equal(fresh.act_eval(frames), dqn.act_eval(frames))


def test_ppo_learns_from_a_uint8_rollout():
    ppo = PPO(PPOConfig(batch_size=16, epochs=1), PONG, seed=0)
    n = 32
    frames = _frames(n, 4)
    acted = ppo.act(frames, env_step=0)
    cut = np.zeros(n, bool)
    cut[-1] = True
    batch = {"obs": torch.from_numpy(frames), "action": torch.from_numpy(acted.actions),
             "log_prob": torch.from_numpy(acted.extras["log_prob"]),
             "value": torch.from_numpy(acted.extras["value"]), "reward": torch.randn(n),
             "bootstrap_value": torch.zeros(n), "terminated": torch.zeros(n, dtype=torch.bool),
             "cut": torch.from_numpy(cut)}
    seen = []
    ppo.net.trunk.register_forward_pre_hook(lambda _m, args: seen.append(args[0].dtype))
    before = ppo.policy_state()
    out = ppo.learn(batch)
    assert set(seen) == {torch.uint8}
    assert all(np.isfinite(float(v)) for v in out.metrics.values())
    assert any(not torch.equal(before[k], v) for k, v in ppo.policy_state().items())


def test_ppo_refuses_continuous_control_from_images():
    spec = EnvSpec(obs_shape=(3, 64, 64), action_shape=(2,), action_low=(-1.0, -1.0),
                   action_high=(1.0, 1.0))
    with pytest.raises(ValueError, match="discrete"):
        PPO(PPOConfig(), spec, seed=0)
